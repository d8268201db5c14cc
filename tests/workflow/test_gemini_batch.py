"""Batch mode on Gemini: a job's shards through the simulator's Gemini Batch API, inline or through
the Files API, answered in input order; an expired batch's answers kept and the rest sent direct;
a cancel of a running batch job cancels its batch at Gemini."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice_local.cloud import run_job
from sluice_local.simulator import SimulatorServer
from tests.conftest import write_jsonl
from tests.workflow.helpers.anthropic_batch import cancel_while_batched
from tests.workflow.helpers.gemini import batch_creates, gemini_lines, generated


def test_a_batch_job_on_gemini_answers_every_line_in_order_and_leaves_nothing_behind(
    make_cloud: Any, simulator: SimulatorServer, tmp_path: Path
) -> None:
    cloud = make_cloud(provider="gemini", shard_lines=20, batch_max_requests=20, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1)
    run = run_job(cloud, write_jsonl(tmp_path / "g.jsonl", gemini_lines(40)), metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(40)] and run.errors == []
    bodies = [r["response"]["body"] for r in run.results]
    assert {b["object"] for b in bodies} == {"chat.completion"}
    assert bodies[0]["choices"][0]["message"]["content"] == "negative"
    assert bodies[1]["choices"][0]["message"]["content"] == "positive"
    assert [s["mode"] for s in run.summary["shards"]] == ["batch"] * 2
    assert len(batch_creates(simulator)) == 2 and generated(simulator) == []
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider"] == costs["provider_all_batch"] > 0
    # collected batches are deleted at the provider
    assert simulator.call(lambda sim: list(sim.gemini_batches.batches)) == []


def test_a_part_past_the_inline_limit_goes_as_a_files_api_upload(
    make_cloud: Any, simulator: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sluice.providers.gemini import batch as batch_module

    monkeypatch.setattr(batch_module, "INLINE_MAX_BYTES", 1024)
    cloud = make_cloud(provider="gemini", shard_lines=30, batch_max_requests=30, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1)
    run = run_job(cloud, write_jsonl(tmp_path / "f.jsonl", gemini_lines(30)), metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(30)] and run.errors == []
    uploads = [e for e in simulator.log if e["method"] == "POST" and e["path"].startswith("/upload/")]
    assert uploads and len(batch_creates(simulator)) == 1


def test_an_expired_gemini_batch_keeps_its_answers_and_sends_the_rest_direct(
    make_cloud: Any, simulator: SimulatorServer, tmp_path: Path
) -> None:
    cloud = make_cloud(provider="gemini", shard_lines=40, batch_max_requests=40, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1, batch_expire_fraction=1.0, batch_expire_done_fraction=0.5)
    path = write_jsonl(tmp_path / "expiring.jsonl", gemini_lines(40))
    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert run.verify(path).ok, run.verify(path).describe()
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(40)] and run.errors == []
    (shard,) = run.summary["shards"]
    assert {b["status"] for b in shard["batch"]["batches"]} == {"expired"}
    direct = generated(simulator)
    assert 0 < len(direct) < 40 and shard["batch"]["direct_fallback_lines"] == len(direct)


def test_an_expired_gemini_batchs_leftovers_are_errors_when_the_job_says_so(
    make_cloud: Any, simulator: SimulatorServer, tmp_path: Path
) -> None:
    cloud = make_cloud(provider="gemini", shard_lines=40, batch_max_requests=40, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1, batch_expire_fraction=1.0, batch_expire_done_fraction=0.5)
    path = write_jsonl(tmp_path / "left.jsonl", gemini_lines(40))
    run = run_job(cloud, path, metadata={"sluice-mode": "batch", "sluice-on-batch-incomplete": "error"})

    assert run.verify(path).ok, run.verify(path).describe()
    assert run.results and run.errors and len(run.results) + len(run.errors) == 40
    assert {e["error"]["code"] for e in run.errors} == {"batch_expired"}
    assert generated(simulator) == []


def test_a_cancel_of_a_running_gemini_batch_job_cancels_its_batch(
    make_cloud: Any, simulator: SimulatorServer, tmp_path: Path
) -> None:
    cloud = make_cloud(provider="gemini", shard_lines=50, batch_max_requests=50, poll_seconds=1)
    # the batch would run for two minutes
    simulator.configure(batch_phase_s=60.0)
    path = write_jsonl(tmp_path / "cancelled.jsonl", gemini_lines(10))
    report, job_id = cancel_while_batched(cloud, simulator, path, "gemini-test-key")

    assert report.batches_cancelled == 1 and report.provider_failures == []
    cancelled = simulator.call(lambda sim: [b.cancel_t is not None for b in sim.gemini_batches.batches.values()])
    assert cancelled == [True]
    cancels = [e for e in simulator.log if e["method"] == "POST" and e["path"].endswith(":cancel")]
    assert len(cancels) == 1
    assert cloud.job(job_id) is not None and cloud.job(job_id).job.status == "CANCELLED"  # type: ignore[union-attr]
