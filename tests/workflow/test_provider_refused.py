"""A provider that refuses every request (issue 31): each shard stops after its first answers, the
lines it did not send are errors carrying the provider's error, and the summary says why."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from sluice.contract import PROVIDER_REFUSED, JobStatus
from sluice.send import refusal
from sluice.send.refusal import REFUSAL_ANSWERS

from sluice_local.cloud import LocalCloud, LocalSettings, run_job
from tests.conftest import request_line, write_jsonl


def test_a_wrong_base_url_ends_the_job_fast_with_the_reason(simulator: Any, tmp_path: Path) -> None:
    # the simulator serves /v1/...: under /wrong/v1 its web server answers a bare 404, no rate headers
    cloud = LocalCloud(
        provider_base_url=simulator.url + "/wrong/v1",
        api_key="sk-test",
        settings=LocalSettings(concurrency=30, map_concurrency=3, shard_lines=100, cache="off"),
    )
    path = write_jsonl(tmp_path / "wrong.jsonl", [request_line(f"q-{n}") for n in range(300)])
    with cloud.running():
        started = time.monotonic()
        run = run_job(cloud, path)
        wall = time.monotonic() - started

    assert run.verify(path).ok
    assert run.summary["status"] == JobStatus.COMPLETED_WITH_ERRORS and not run.results
    codes = Counter(e["error"]["code"] for e in run.errors)
    sent = codes["provider_error"]
    # each of the 3 shards sent its first answers and what was in flight, not its 100 lines
    assert 3 * REFUSAL_ANSWERS <= sent <= 3 * (REFUSAL_ANSWERS + 10)
    assert codes["provider_refused"] == 300 - sent
    refused = run.summary[PROVIDER_REFUSED]
    assert refused == {
        "status": 404,
        "message": "404: Not Found",
        "cause": refused["cause"],
        "lines": 300 - sent,
    }
    assert refused["cause"].startswith("wrong URL path")
    unsent = next(e for e in run.errors if e["error"]["code"] == "provider_refused")
    assert "HTTP 404: 404: Not Found" in unsent["error"]["message"] and unsent["response"] is None
    assert wall < 60


def test_a_job_the_provider_answers_has_no_refusal(make_cloud: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "fine.jsonl", [request_line(f"q-{n}") for n in range(30)])
    run = run_job(make_cloud(shard_lines=10), path)
    assert run.summary["status"] == JobStatus.SUCCEEDED
    assert run.summary[PROVIDER_REFUSED] is None


def test_a_provider_failing_every_attempt_ends_the_job_fast_with_every_line_accounted(
    make_cloud: Any, simulator: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """Issue 42: a 500 on every attempt of every request stops each shard as a refusal does: the
    lines that ran out of attempts keep their errors, the others are `provider_refused`, and the
    shard's last sweep does not send any of them again."""
    # the outage has lasted long enough from the start (5 s by default: a shorter one is swept)
    monkeypatch.setattr(refusal, "OUTAGE_S", 0.0)
    simulator.configure(rate_500=1.0)
    cloud = make_cloud(shard_lines=100, concurrency=10, max_attempts=2)
    path = write_jsonl(tmp_path / "down.jsonl", [request_line(f"q-{n}") for n in range(300)])
    run = run_job(cloud, path)

    assert run.verify(path).ok
    assert run.summary["status"] == JobStatus.COMPLETED_WITH_ERRORS and not run.results
    codes = Counter(e["error"]["code"] for e in run.errors)
    assert set(codes) <= {"retries_exhausted", "provider_refused"}
    # each of the 3 shards: its first answers, and at most its requests in flight given up
    assert 3 * REFUSAL_ANSWERS <= codes["retries_exhausted"] <= 3 * (REFUSAL_ANSWERS + 10)
    refused = run.summary[PROVIDER_REFUSED]
    assert refused["status"] == 500 and refused["cause"].startswith("server error")
    assert refused["lines"] == codes["provider_refused"]
    # one attempt a line in the first pass (of 2), and no sweep once the run was refused
    posts = Counter(e["custom_id"] for e in simulator.log if e["method"] == "POST" and e["custom_id"])
    assert max(posts.values()) == 1 and len(posts) <= 3 * (REFUSAL_ANSWERS + 15)
