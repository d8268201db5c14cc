"""Batch mode end to end: the deployed state machine in moto, the Batch API in the simulator."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from sluice.store.jobs import JobStore

from sluice_local.cloud import run_job
from tests.conftest import write_jsonl
from tests.workflow.helpers.batch import batch_creates, ids, lines, returned_by_batches, sent_directly


def test_a_batch_job_wakes_on_webhooks_and_writes_results_in_input_order(make_cloud, simulator, tmp_path: Path) -> None:
    # a 60 s polling interval: only the batch.completed webhooks can make this quick
    cloud = make_cloud(shard_lines=50, batch_max_requests=50, poll_seconds=60)
    simulator.configure(batch_phase_s=0.1, webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret)
    started = time.monotonic()
    run = run_job(cloud, write_jsonl(tmp_path / "batch.jsonl", lines(120)), metadata={"sluice-mode": "batch"})
    seconds = time.monotonic() - started

    assert run.status == "SUCCEEDED"
    assert seconds < 30, f"took {seconds:.1f} s: the webhooks did not wake the shards (the poll interval is 60 s)"
    assert ids(run.results) == [f"q-{n}" for n in range(120)] and run.errors == []
    assert all(r["response"]["status_code"] == 200 for r in run.results)
    assert run.results[0]["response"]["body"]["choices"][0]["message"]["content"] == "negative"
    assert len(batch_creates(simulator)) == 3 and not sent_directly(simulator)
    assert sum(1 for i in cloud.invocations if i.step == "collect_batch") == 3  # no polling rounds
    accepted = [w for w in simulator.webhooks if w["type"] == "batch.completed" and w["deliveries"]]
    assert len(accepted) == 3
    assert [s["mode"] for s in run.summary["shards"]] == ["batch"] * 3
    assert all(s["batch"]["direct_fallback_lines"] == 0 for s in run.summary["shards"])
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider"] == costs["provider_all_batch"] and costs["batch_savings"] > 0
    # a batch's rows have no latency of their own: each batch reports its turnaround instead
    assert run.summary["latency_s"]["p50"] is None and run.summary["latency_histogram"] == []
    turnarounds = [b["turnaround_s"] for s in run.summary["shards"] for b in s["batch"]["batches"]]
    assert len(turnarounds) == 3 and all(isinstance(t, float) and 0 <= t < 30 for t in turnarounds)
    # inputs and answers are in S3 now; no copies are left at the provider
    assert simulator.call(lambda sim: list(sim.files)) == []


def test_with_every_webhook_lost_polling_finishes_a_shard_of_several_batches(
    make_cloud, simulator, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=100, batch_max_requests=100, poll_seconds=1)
    simulator.configure(
        batch_phase_s=0.1, webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret, webhook_drop_rate=1.0
    )
    # four models, so the one shard owns four batches (a batch holds one model)
    models = [orjson.loads(line) for line in lines(100)]
    for n, row in enumerate(models):
        row["body"]["model"] = f"gpt-4o-mini-{n % 4}"
    path = write_jsonl(tmp_path / "polled.jsonl", [orjson.dumps(row) + b"\n" for row in models])
    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED"
    assert ids(run.results) == [f"q-{n}" for n in range(100)]
    assert all(w["dropped"] and not w["deliveries"] for w in simulator.webhooks)
    assert len(run.summary["shards"][0]["batch"]["batches"]) == 4
    assert len(batch_creates(simulator)) == 4 and not sent_directly(simulator)


def test_an_expiring_batch_falls_back_to_direct_for_its_leftovers_only(make_cloud, simulator, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=40, batch_max_requests=40, poll_seconds=1)
    simulator.configure(
        batch_phase_s=0.1,
        batch_expire_fraction=1.0,
        batch_expire_done_fraction=0.5,
        webhook_url=cloud.webhook_url,
        webhook_secret=cloud.webhook_secret,
    )
    path = write_jsonl(tmp_path / "expiring.jsonl", lines(80))
    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok, run.verify(path).describe()
    everyone = [f"q-{n}" for n in range(80)]
    assert ids(run.results) == everyone and run.errors == []
    in_batches = returned_by_batches(simulator)
    direct = sent_directly(simulator)
    assert in_batches and direct
    # nothing a batch answered went out again, each leftover went out once, and together they are everyone
    assert not set(in_batches) & set(direct)
    assert set(direct.values()) == {1} and set(in_batches.values()) == {1}
    assert sorted(set(in_batches) | set(direct)) == sorted(everyone)
    assert {b["status"] for s in run.summary["shards"] for b in s["batch"]["batches"]} == {"expired"}
    assert sum(s["batch"]["direct_fallback_lines"] for s in run.summary["shards"]) == len(direct)
    assert [i.step for i in cloud.invocations].count("run_shard") == 2


def test_an_expiring_batch_with_on_batch_incomplete_error_reports_the_leftovers(
    make_cloud, simulator, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=50, batch_max_requests=50, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1, batch_expire_fraction=1.0, batch_expire_done_fraction=0.5)
    run = run_job(
        cloud,
        write_jsonl(tmp_path / "strict.jsonl", lines(50)),
        metadata={"sluice-mode": "batch", "sluice-on-batch-incomplete": "error"},
    )
    assert run.status == "SUCCEEDED"
    accounted = sorted(ids(run.results) + ids(run.errors), key=lambda c: int(c.split("-")[1]))
    assert accounted == [f"q-{n}" for n in range(50)]
    assert run.errors and {e["error"]["code"] for e in run.errors} == {"batch_expired"}
    assert not sent_directly(simulator)
    assert run.summary["errors_by_code"] == {"batch_expired": len(run.errors)}


def test_a_batch_that_fails_validation_puts_the_providers_errors_on_its_rows(
    make_cloud, simulator, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=25, batch_max_requests=25, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1, batch_validation_error=True)
    path = write_jsonl(tmp_path / "invalid.jsonl", lines(50))
    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok, run.verify(path).describe()
    # the simulator blames the first row of each file; the rest never ran and go direct
    assert ids(run.errors) == ["q-0", "q-25"]
    assert {e["error"]["code"] for e in run.errors} == {"batch_failed"}
    assert all("simulated_validation_error" in e["error"]["message"] for e in run.errors)
    assert ids(run.results) == [f"q-{n}" for n in range(50) if n not in (0, 25)]
    assert sorted(sent_directly(simulator)) == sorted(ids(run.results))


class Transient(Exception):
    """Named like the errors the state machine retries."""


def test_a_retried_submit_batch_creates_no_second_batch(
    make_cloud, simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud = make_cloud(shard_lines=100, batch_max_requests=100, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1)
    original = JobStore.set_shard_batches
    failures: list[list[str]] = []

    def dies_once(self: JobStore, job_id: str, shard: int, batch_ids: list[str]) -> None:
        if not failures:
            # the batch exists at the provider, but the Lambda dies before it is written down
            failures.append(batch_ids)
            raise Transient("the Lambda's answer was lost")
        original(self, job_id, shard, batch_ids)

    monkeypatch.setattr(JobStore, "set_shard_batches", dies_once)
    run = run_job(cloud, write_jsonl(tmp_path / "retried.jsonl", lines(60)), metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED"
    assert ids(run.results) == [f"q-{n}" for n in range(60)]
    submits = [i for i in cloud.invocations if i.step == "submit_batch"]
    assert len(submits) == 2 and submits[0].error is not None and submits[1].error is None
    creates = batch_creates(simulator)
    assert len(creates) == 1
    assert failures == [[creates[0]["batch_id"]]]
    assert not sent_directly(simulator)


def test_auto_mode_batches_the_big_shards_and_reports_the_saving(
    make_cloud, simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud = make_cloud(shard_lines=60, batch_max_requests=60, poll_seconds=1)
    monkeypatch.setenv("SLUICE_AUTO_BATCH_MIN_REQUESTS", "50")
    simulator.configure(batch_phase_s=0.1, webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret)
    run = run_job(cloud, write_jsonl(tmp_path / "auto.jsonl", lines(100)), metadata={"sluice-mode": "auto"})

    assert run.status == "SUCCEEDED"
    assert ids(run.results) == [f"q-{n}" for n in range(100)]
    assert run.summary["mode"] == "auto"
    assert [(s["mode"], s["lines"]) for s in run.summary["shards"]] == [("batch", 60), ("direct", 40)]
    assert len(batch_creates(simulator)) == 1 and len(sent_directly(simulator)) == 40
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider_all_batch"] < costs["provider"] < costs["provider_all_direct"]
    assert costs["batch_savings"] == pytest.approx(costs["provider_all_direct"] - costs["provider"])
    direct_shard = run.summary["shards"][1]
    assert "batch" not in direct_shard
    assert direct_shard["provider_cost_usd"]["as_run"] == direct_shard["provider_cost_usd"]["all_direct"]
