"""One shard's failure is that shard's: its open work at the provider is cancelled, its unfinished
lines go to the errors naming the cause, and the job's other shards run on to their results."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sluice_local.cloud import run_job
from tests.conftest import request_line, write_jsonl

LINES = 40
SHARD_LINES = 10


def doomed(step: str, shard: int, message: str) -> Any:
    """A `before_invoke` that fails every `step` of `shard`, as a defect would, with `message`."""

    def fail(name: str, payload: dict[str, Any]) -> None:
        if name == step and payload.get("shard", {}).get("shard") == shard:
            raise ValueError(message)

    return fail


def by_outcome(run: Any) -> tuple[list[str], list[str]]:
    return [r["custom_id"] for r in run.results], [e["custom_id"] for e in run.errors]


def test_a_batch_shard_that_fails_has_its_batch_cancelled_and_its_siblings_finish(
    make_cloud, simulator, tmp_path: Path
) -> None:
    # batches stay open long enough that the failed shard's is still running when it fails
    simulator.configure(batch_phase_s=1.0)
    cloud = make_cloud(shard_lines=SHARD_LINES, batch_max_requests=SHARD_LINES, map_concurrency=4, poll_seconds=1)
    cloud.before_invoke = doomed("collect_batch", 2, "results_url 'results' is not absolute")
    path = write_jsonl(tmp_path / "mixed.jsonl", [request_line(f"m-{n}") for n in range(LINES)])

    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})

    failed = {f"m-{n}" for n in range(2 * SHARD_LINES, 3 * SHARD_LINES)}
    results, errors = by_outcome(run)
    assert results == [f"m-{n}" for n in range(LINES) if f"m-{n}" not in failed]
    assert errors == sorted(failed, key=lambda c: int(c[2:]))
    cause = "ValueError: results_url 'results' is not absolute"
    assert all(e["error"]["code"] == "shard_failed" and cause in e["error"]["message"] for e in run.errors)
    assert all("Traceback" not in e["error"]["message"] for e in run.errors)
    # a failed shard never leaves a job SUCCEEDED; past max_error_rate (0) it is FAILED, naming the cause
    assert run.summary["status"] == "FAILED" and cause in run.summary["error"]
    assert run.summary["counts"]["results"] == LINES - SHARD_LINES
    assert [s.get("failure") for s in run.summary["shards"]] == [None, None, cause, None]
    # the failed shard's batch was cancelled at the provider; the others' were not
    cancels = [e for e in simulator.log if e["method"] == "POST" and e["path"].endswith("/cancel")]
    assert len(cancels) == 1
    assert not any(i.step == "mark_failed" for i in cloud.invocations)


@pytest.mark.parametrize("max_error_rate", ["0.5"])
def test_a_direct_shard_that_fails_within_the_error_rate_completes_its_job_with_errors(
    make_cloud, tmp_path: Path, max_error_rate: str
) -> None:
    cloud = make_cloud(shard_lines=SHARD_LINES, map_concurrency=2)
    cloud.before_invoke = doomed("run_shard", 0, "disk on fire")
    path = write_jsonl(tmp_path / "direct.jsonl", [request_line(f"d-{n}") for n in range(LINES)])

    run = run_job(cloud, path, metadata={"sluice-max-error-rate": max_error_rate})

    results, errors = by_outcome(run)
    assert results == [f"d-{n}" for n in range(SHARD_LINES, LINES)]
    assert errors == [f"d-{n}" for n in range(SHARD_LINES)]
    assert Counter(e["error"]["code"] for e in run.errors) == Counter({"shard_failed": SHARD_LINES})
    assert run.status == "SUCCEEDED" and run.summary["status"] == "COMPLETED_WITH_ERRORS"
    assert "ValueError: disk on fire" in run.summary["error"]
    assert run.verify(path).ok


def test_a_job_that_fails_cancels_its_open_batches_and_accounts_for_every_line(
    make_cloud, simulator, tmp_path: Path
) -> None:
    """A shard whose ShardFailed fails too fails the Map, and with it the job: MarkFailed then
    cancels every batch still open at the provider before it writes the outputs."""
    # slow batches: the others are still running when the job fails
    simulator.configure(batch_phase_s=5.0)
    cloud = make_cloud(shard_lines=SHARD_LINES, batch_max_requests=SHARD_LINES, map_concurrency=4, poll_seconds=1)

    def fail(name: str, payload: dict[str, Any]) -> None:
        if name in ("collect_batch", "fail_shard") and payload.get("shard", {}).get("shard") == 1:
            raise ValueError("disk on fire")

    cloud.before_invoke = fail
    path = write_jsonl(tmp_path / "doomed.jsonl", [request_line(f"b-{n}") for n in range(LINES)])

    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})

    assert run.status == "FAILED" and run.summary["status"] == "FAILED"
    assert run.verify(path).ok
    created = [e for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/batches"]
    polled = {e["path"].split("/")[3] for e in simulator.log if e["method"] == "GET" and "/v1/batches/" in e["path"]}
    cancelled = {e["path"].split("/")[3] for e in simulator.log if e["path"].endswith("/cancel")}
    assert len(created) == LINES // SHARD_LINES
    # moto's Map lets the other children run to their end before it fails (AWS stops them, and
    # their batches are left open for MarkFailed too): the batch left open is the failed shard's,
    # which no step polled again, and MarkFailed cancelled it
    assert len(cancelled) == 1 and not cancelled & polled and len(polled) == len(created) - 1
    assert {e["error"]["code"] for e in run.errors} <= {"job_failed"}
