"""Batch mode on Anthropic (issue 32): a job's shards through Message Batches in the simulator,
answered under the user's own ids whatever they are, an expired batch's leftovers sent direct,
and a cancel of a running batch job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from sluice_local.cloud import run_job
from sluice_local.simulator import SimulatorServer
from tests.conftest import request_line, write_jsonl
from tests.workflow.helpers.anthropic_batch import cancel_while_batched

MODEL = "claude-3-5-haiku-latest"
BATCHES = "/v1/messages/batches"


def chat_line(custom_id: str, n: int) -> bytes:
    line = request_line(custom_id, "great value" if n % 2 else "awful, broke at once")
    return line.replace(b"gpt-4o-mini", MODEL.encode())


def native_line(custom_id: str) -> bytes:
    body = {
        "model": MODEL,
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "Reply with one word, positive or negative:\n\nI loved it"}],
    }
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/messages", "body": body}) + b"\n"


def posts(simulator: SimulatorServer, path: str) -> list[dict[str, Any]]:
    return [e for e in simulator.log if e["method"] == "POST" and e["path"] == path]


def test_a_batch_job_on_anthropic_answers_every_line_under_the_users_own_ids(
    make_cloud, simulator, tmp_path: Path
) -> None:
    simulator.reset()
    cloud = make_cloud(provider="anthropic", shard_lines=20, batch_max_requests=20, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1)
    # ids Message Batches would refuse: unicode, spaces, 100 characters
    users = [f"avis-é€-{n}-" + "x" * (100 - len(f"avis-é€-{n}-")) for n in range(15)]
    users += [f"ünïcødé id {n}" for n in range(15)]
    lines = [chat_line(custom_id, n) for n, custom_id in enumerate(users)] + [native_line("native/1")]
    run = run_job(cloud, write_jsonl(tmp_path / "claude-batch.jsonl", lines), metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert [r["custom_id"] for r in run.results] == [*users, "native/1"] and run.errors == []
    assert all(len(custom_id) == 100 for custom_id in users[:15])
    chat = [r["response"]["body"] for r in run.results[:-1]]
    assert {b["object"] for b in chat} == {"chat.completion"} and {b["model"] for b in chat} == {MODEL}
    assert chat[0]["choices"][0]["message"]["content"] == "negative"
    assert chat[1]["choices"][0]["message"]["content"] == "positive"
    native = run.results[-1]["response"]["body"]
    assert native["type"] == "message" and native["content"] == [{"type": "text", "text": "positive"}]
    assert [s["mode"] for s in run.summary["shards"]] == ["batch"] * 2
    # a file holds one endpoint: the second shard's native line goes in a batch of its own
    assert len(posts(simulator, BATCHES)) == 3 and posts(simulator, "/v1/messages") == []
    assert run.summary["tokens"]["input"] > 0 and run.summary["tokens"]["output"] > 0
    # collected batches are deleted at the provider
    assert simulator.call(lambda sim: list(sim.message_batches.batches)) == []


def test_auto_mode_on_anthropic_batches_the_big_shard_and_sends_the_small_one_direct(
    make_cloud, simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    simulator.reset()
    cloud = make_cloud(provider="anthropic", shard_lines=30, batch_max_requests=30, poll_seconds=1)
    monkeypatch.setenv("SLUICE_AUTO_BATCH_MIN_REQUESTS", "25")
    simulator.configure(batch_phase_s=0.1)
    path = write_jsonl(tmp_path / "auto.jsonl", [chat_line(f"a-{n}", n) for n in range(50)])
    run = run_job(cloud, path, metadata={"sluice-mode": "auto"})

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert [r["custom_id"] for r in run.results] == [f"a-{n}" for n in range(50)] and run.errors == []
    assert [(s["mode"], s["lines"]) for s in run.summary["shards"]] == [("batch", 30), ("direct", 20)]
    assert len(posts(simulator, BATCHES)) == 1 and len(posts(simulator, "/v1/messages")) == 20


def test_a_batch_anthropics_full_queue_refuses_is_created_again_once_there_is_room(
    make_cloud, simulator, tmp_path: Path
) -> None:
    simulator.reset()
    cloud = make_cloud(provider="anthropic", shard_lines=10, batch_max_requests=10, poll_seconds=1, map_concurrency=2)
    # room for one shard's batch at a time, which Sluice's own queue limit does not know
    simulator.configure(batch_phase_s=0.2, batch_queue_limit=400)
    path = write_jsonl(tmp_path / "queued.jsonl", [chat_line(f"q-{n}", n) for n in range(20)])
    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(20)] and run.errors == []
    refused = [e for e in posts(simulator, BATCHES) if e["status"] == 429]
    assert refused and len(posts(simulator, BATCHES)) == 2 + len(refused)
    assert sum(s["batch"]["requeued"] for s in run.summary["shards"]) == len(refused)
    assert posts(simulator, "/v1/messages") == []


def test_an_expired_anthropic_batch_keeps_its_answers_and_sends_the_rest_direct(
    make_cloud, simulator, tmp_path: Path
) -> None:
    simulator.reset()
    cloud = make_cloud(provider="anthropic", shard_lines=40, batch_max_requests=40, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1, batch_expire_fraction=1.0, batch_expire_done_fraction=0.5)
    path = write_jsonl(tmp_path / "expiring.jsonl", [chat_line(f"q-{n}", n) for n in range(40)])
    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert run.verify(path).ok, run.verify(path).describe()
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(40)] and run.errors == []
    direct = posts(simulator, "/v1/messages")
    (shard,) = run.summary["shards"]
    assert {b["status"] for b in shard["batch"]["batches"]} == {"expired"}
    assert 0 < len(direct) < 40 and shard["batch"]["direct_fallback_lines"] == len(direct)
    assert {r["response"]["body"]["object"] for r in run.results} == {"chat.completion"}


def test_a_cancel_of_a_running_anthropic_batch_job_cancels_its_batch(make_cloud, simulator, tmp_path: Path) -> None:
    simulator.reset()
    cloud = make_cloud(provider="anthropic", shard_lines=50, batch_max_requests=50, poll_seconds=1)
    # the batch would run for two minutes
    simulator.configure(batch_phase_s=60.0)
    path = write_jsonl(tmp_path / "cancelled.jsonl", [chat_line(f"c-{n}", n) for n in range(10)])
    report, job_id = cancel_while_batched(cloud, simulator, path, "sk-test")

    assert report.batches_cancelled == 1 and report.provider_failures == []
    cancelled = simulator.call(lambda sim: [b.cancel_at is not None for b in sim.message_batches.batches.values()])
    assert cancelled == [True]
    assert len(posts(simulator, f"{BATCHES}/{report_batch_id(simulator)}/cancel")) == 1
    assert cloud.job(job_id) is not None and cloud.job(job_id).job.status == "CANCELLED"  # type: ignore[union-attr]


def report_batch_id(simulator: SimulatorServer) -> str:
    (batch_id,) = simulator.call(lambda sim: list(sim.message_batches.batches))
    return str(batch_id)
