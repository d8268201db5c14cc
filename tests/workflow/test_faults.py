"""A provider that misbehaves slows a job; it never loses a line (invariant 6)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sluice.shard import parts

from sluice_local.cloud import LambdaTimeout, run_job
from tests.conftest import request_line, write_jsonl


def lines(n: int, prefix: str = "f") -> list[bytes]:
    return [
        request_line(f"{prefix}-{i}", url="/v1/embeddings" if i % 3 == 0 else "/v1/chat/completions") for i in range(n)
    ]


def sends(simulator: Any) -> Counter[str]:
    return Counter(e["custom_id"] for e in simulator.log if e["method"] == "POST" and e["custom_id"])


@pytest.mark.parametrize(
    ("name", "faults"),
    [
        ("429 storm with Retry-After", {"rate_429": 0.3, "retry_after_s": 0.2}),
        ("bursts of 5xx", {"rate_500": 0.4}),
        ("dropped connections", {"rate_drop": 0.3}),
        ("slower than the request timeout", {"rate_slow": 0.3, "slow_s": 3.0}),
        ("queue wait exceeded", {"rate_queue_wait": 0.3, "retry_after_s": 0.1}),
    ],
)
def test_faults_slow_the_job_but_lose_nothing(make_cloud, simulator, tmp_path: Path, name: str, faults: dict) -> None:
    simulator.configure(**faults)
    cloud = make_cloud(shard_lines=70, concurrency=40, request_timeout_s=1.0, max_attempts=10)
    path = write_jsonl(tmp_path / "faulty.jsonl", lines(200))
    run = run_job(cloud, path)

    assert run.status == "SUCCEEDED", name
    report = run.verify(path)
    assert report.ok, report.describe()
    assert len(run.results) == 200, f"{name}: {Counter(e['error']['code'] for e in run.errors)}"
    assert run.summary["retries"] > 0
    if "rate_429" in faults:
        assert run.summary["throttled"] > 0


def test_the_provider_down_for_a_while_then_back(make_cloud, simulator, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=100, concurrency=20, max_attempts=10)
    path = write_jsonl(tmp_path / "outage.jsonl", lines(100))
    # the outage starts with the job, not with the local cloud (whose IAM set-up takes a while)
    simulator.configure(rate_500=1.0)
    threading.Timer(1.5, lambda: simulator.configure(rate_500=0.0)).start()
    started = time.monotonic()
    run = run_job(cloud, path)
    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok
    assert len(run.results) == 100
    assert time.monotonic() - started > 1.5


def test_an_exhausted_retry_budget_puts_the_line_in_errors_with_the_reason(
    make_cloud, simulator, tmp_path: Path
) -> None:
    simulator.configure(rate_500=1.0)
    cloud = make_cloud(shard_lines=100, concurrency=20, max_attempts=2)
    # fewer lines than it takes a provider refusing every request to stop the job (`sluice.refusal`)
    path = write_jsonl(tmp_path / "hopeless.jsonl", lines(15))
    run = run_job(cloud, path)

    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok
    assert run.results == []
    assert {e["error"]["code"] for e in run.errors} == {"retries_exhausted"}
    assert all(
        "gave up after 2 attempts" in e["error"]["message"] and "HTTP 500" in e["error"]["message"] for e in run.errors
    )
    assert all(e["response"]["status_code"] == 500 for e in run.errors)
    # two attempts in all: one, then one in the shard's last sweep
    assert all("(1, then 1 in the shard's last sweep)" in e["error"]["message"] for e in run.errors)
    assert sends(simulator) == Counter({f"f-{i}": 2 for i in range(15)})


def test_a_shard_lambda_killed_mid_run_resumes_without_resending_finished_items(
    make_cloud, simulator, monkeypatch, tmp_path: Path
) -> None:
    """Killed after its first checkpoint: what that checkpoint holds is never sent again."""
    simulator.configure(latency_s=0.02)
    cloud = make_cloud(shard_lines=5000, concurrency=30)
    checkpointed: set[str] = set()
    killed = threading.Event()
    original_write = parts.PartWriter._write

    def write_then_die(self: Any, chunk: Any, seq: int, finished: bool) -> None:
        original_write(self, chunk, seq, finished)
        if not killed.is_set():
            checkpointed.update(row.split(b'"custom_id":"')[1].split(b'"')[0].decode() for row in chunk.rows)
            killed.set()
            raise LambdaTimeout("Task timed out after 900.00 seconds")

    monkeypatch.setattr(parts.PartWriter, "_write", write_then_die)
    path = write_jsonl(tmp_path / "killed.jsonl", lines(2500))
    run = run_job(cloud, path)

    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok
    runs = [i for i in cloud.invocations if i.step == "run_shard"]
    assert runs[0].error and "Timedout" not in (runs[-1].error or "")
    assert 0 < len(checkpointed) <= 1000
    sent = sends(simulator)
    assert all(sent[cid] == 1 for cid in checkpointed), "a checkpointed item was sent again"
    assert set(sent) == {f"f-{i}" for i in range(2500)}
