"""Background mode: Responses created with background=true, collected when they settle."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sluice_local.cloud import run_job
from tests.conftest import request_line, write_jsonl


def test_background_job_settles_on_the_finish_reason(make_cloud, simulator, tmp_path: Path) -> None:
    simulator.configure(latency_s=0.2, incomplete_rate=0.25, failed_rate=0.05)
    cloud = make_cloud(shard_lines=40, concurrency=20, poll_seconds=1)
    path = write_jsonl(tmp_path / "bg.jsonl", [request_line(f"b-{n}", url="/v1/responses") for n in range(100)])
    run = run_job(cloud, path, metadata={"sluice-mode": "background"})

    assert run.status == "SUCCEEDED"
    ids = [r["custom_id"] for r in run.results] + [e["custom_id"] for e in run.errors]
    assert sorted(ids) == sorted(f"b-{n}" for n in range(100)) and len(ids) == 100
    statuses = Counter(r["response"]["body"]["status"] for r in run.results)
    # an incomplete answer with output is a result, carrying why it stopped
    assert statuses["incomplete"] > 0 and set(statuses) <= {"completed", "incomplete"}
    incomplete = next(r for r in run.results if r["response"]["body"]["status"] == "incomplete")
    assert incomplete["response"]["body"]["incomplete_details"]["reason"] == "max_output_tokens"
    assert all(e["error"]["code"] == "response_failed" for e in run.errors)
    assert {s["mode"] for s in run.summary["shards"]} == {"background"}
    created = Counter(e["custom_id"] for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/responses")
    assert created == Counter({f"b-{n}": 1 for n in range(100)})
