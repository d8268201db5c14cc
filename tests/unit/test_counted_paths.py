"""The counted runs (`bench/scale/runs.py`) take every family in each of its modes, and the recorded
counts hold the calls that go around boto3: Bedrock's signed requests and its batch jobs' calls."""

from __future__ import annotations

from typing import Any

import pytest
from sluice.contract import PROVIDERS, causes
from sluice.providers import modes

from bench import capacity
from bench.scale import paper, rates, runs


@pytest.fixture(scope="module")
def counted() -> list[dict[str, Any]]:
    return capacity.load()


def _calls(counted: list[dict[str, Any]], variant: str) -> dict[tuple[str, str, str], int]:
    found: dict[tuple[str, str, str], int] = {}
    for run in counted:
        if run["variant"] == variant:
            for t in run["targets"]:
                key = (t["cause"], t["service"], t["operation"])
                found[key] = found.get(key, 0) + t["calls"]
    return found


def test_every_family_runs_in_every_mode_it_offers() -> None:
    taken = {(v.family, v.mode) for v in runs.VARIANTS}
    offered = {(family, mode) for family in PROVIDERS for mode in modes(family)}
    assert offered <= taken, f"not counted: {sorted(offered - taken)}"


def test_the_counts_hold_bedrocks_signed_requests_under_their_cause(counted: list[dict[str, Any]]) -> None:
    calls = _calls(counted, "bedrock direct")
    converse = calls.get((causes.SIGNED.name, "bedrock-runtime", "Converse"), 0)
    lines = sum(r["lines"] for r in counted if r["variant"] == "bedrock direct")
    assert converse == lines


def test_the_counts_hold_bedrocks_batch_jobs_and_their_events(counted: list[dict[str, Any]]) -> None:
    calls = _calls(counted, "bedrock batch")
    assert calls.get((causes.BATCH_SUBMIT.name, "bedrock", "CreateModelInvocationJob"), 0) > 0
    assert calls.get((causes.BATCH_COLLECT.name, "bedrock", "GetModelInvocationJob"), 0) > 0
    # the job-state events reach the webhook function, which wakes the shard
    occurred = {c for r in counted if r["variant"] == "bedrock batch" for c in r["occurrences"]}
    assert causes.BATCH_WEBHOOK.name in occurred


def _targets(counted: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    return [(t["cause"], t["service"], t["operation"], t["shape"]) for run in counted for t in run["targets"]]


def _occurred(counted: list[dict[str, Any]]) -> set[str]:
    return {cause for run in counted for cause, n in run["occurrences"].items() if n > 0}


@pytest.mark.parametrize(
    "cause",
    [causes.SHARD_FAILED, causes.MARK_FAILED],
    ids=["a failed shard's end", "MarkFailed"],
)
def test_a_counted_run_takes_each_failure_path(counted: list[dict[str, Any]], cause: causes.Cause) -> None:
    assert cause.name in _occurred(counted), f"no counted run takes {cause.name!r}"


def test_a_counted_run_takes_mark_faileds_last_resort(counted: list[dict[str, Any]]) -> None:
    # only the last resort reads the input for every shard's lines under the shard's outputs
    reads = [t for t in _targets(counted) if t[0] == causes.SHARD_OUTPUTS.name and t[2] == "GetObject"]
    assert any(shape.startswith("inbox/") for *_, shape in reads), reads


def test_a_counted_run_takes_plans_read_of_past_turnarounds(counted: list[dict[str, Any]]) -> None:
    reads = [t for t in _targets(counted) if t[0] == causes.PLAN.name and t[2] == "GetObject"]
    assert any(shape.startswith("turnarounds/") for *_, shape in reads), reads


def test_a_counted_run_takes_bedrocks_queue_full_requeue(counted: list[dict[str, Any]]) -> None:
    # counted, not compared: its polls depend on when the queue has room, so paper bounds it
    full = [run for run in counted if run["occurrences"].get(causes.REQUEUED.name, 0) > 0]
    assert full and not any(run["compared"] for run in full)
    assert any("the provider's queue had no room" in b.name for b in paper.bounds(rates.maximum("batch")))


def test_a_counted_run_takes_the_batch_queues_reconcile(counted: list[dict[str, Any]]) -> None:
    # the run fails unless the queue was reconciled; it is due every 300 s, so paper says how often
    full = _runs_of(counted, "batch, its token queue full")
    assert full and not any(run["compared"] for run in full)
    assert all(run["occurrences"].get(causes.REQUEUED.name, 0) > 0 for run in full)
    assert any("reconcile" in b.name for b in paper.bounds(rates.maximum("batch")))


def _runs_of(counted: list[dict[str, Any]], variant: str) -> list[dict[str, Any]]:
    return [run for run in counted if run["variant"] == variant]


def test_a_counted_run_takes_sluice_cancel_of_a_running_batch_job(counted: list[dict[str, Any]]) -> None:
    # counted, not compared: what the shards did before the cancel depends on when it came
    cancelled = [run for run in counted if run["occurrences"].get(causes.CANCEL.name, 0) > 0]
    assert cancelled and not any(run["compared"] for run in cancelled)
    assert all(run["occurrences"].get(causes.BATCH_SUBMIT.name, 0) == run["shards"] for run in cancelled)
    cancels = [t for t in _targets(cancelled) if t[0] == causes.CANCEL.name]
    assert any(service == "sfn" and op == "StopExecution" for _, service, op, _ in cancels), cancels
    assert any("sluice cancel" in b.name for b in paper.bounds(rates.maximum("batch")))


def test_a_counted_run_takes_the_deadlines_cutover(counted: list[dict[str, Any]]) -> None:
    # the run checks every shard's plan says it was cut over; its polls depend on the batch's timing
    late = _runs_of(counted, "batch past its deadline's cutover")
    assert late and not any(run["compared"] for run in late)
    assert all(run["occurrences"].get(causes.BATCH_SUBMIT.name, 0) == run["shards"] for run in late)
    assert any("cutover" in b.name for b in paper.bounds(rates.maximum("batch")))
