"""A job that fails stops its running shards as a cancelled one does: within one poll period.

On AWS a shard that fails fails the Map at once, and MarkFailed runs while the other shards'
Lambdas are still sending (Step Functions cannot stop a running Lambda). moto's Map waits for
every child first, so the test plays that moment: it calls MarkFailed, as its own role, while the
shards run, then stops the execution as the failed Map would have ended its children.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest
from sluice.shard import frame as shard
from sluice_handlers import mark_failed, plan

from sluice_local.cloud import REGION, LambdaContext, function_name
from tests.conftest import request_line, write_jsonl

LINES = 400
POLL_S = 1.0


def test_a_failed_job_stops_its_running_shards_within_one_poll_period(
    make_cloud: Any, simulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard, "CANCEL_CHECK_S", POLL_S)
    planned: list[dict[str, Any]] = []
    planning = plan.handler

    def remembered(event: dict[str, Any], context: Any) -> dict[str, Any]:
        result = planning(event, context)
        planned.append(result)
        return result

    monkeypatch.setattr(plan, "handler", remembered)
    # two shards of 200 lines, two requests at a time each: about five seconds to send them all
    cloud = make_cloud(shard_lines=200, map_concurrency=2, concurrency=2)
    simulator.configure(latency_s=0.05)
    path = write_jsonl(tmp_path / "doomed.jsonl", [request_line(f"d-{n}") for n in range(LINES)])
    key, etag = cloud.upload(path)
    execution = cloud.start(cloud.object_created_event(key, etag))

    deadline = time.monotonic() + 60
    while len({int(e["custom_id"][2:]) // 200 for e in simulator.log if e.get("custom_id")}) < 2:
        assert time.monotonic() < deadline, "both shards should be sending"
        time.sleep(0.02)
    failed_at = time.time()
    detail = mark_failed.handler(
        {"plan": planned[0], "error": {"Error": "States.ExceedToleratedFailureThreshold", "Cause": "a shard failed"}},
        LambdaContext(function_name("mark_failed"), 900),
    )
    boto3.client("stepfunctions", region_name=REGION).stop_execution(executionArn=execution, error="Map failed")
    while len([i for i in cloud.invocations if i.step == "run_shard"]) < 2:
        assert time.monotonic() < deadline, "the shards' runs should end once they see the job failed"
        time.sleep(0.02)

    sent = [e for e in simulator.log if e["method"] == "POST"]
    # a request in flight when the shard looked may still be answered: one request's time
    late = [e for e in sent if e["t"] > failed_at + POLL_S + 0.5]
    assert late == [] and len(sent) < LINES
    runs = [i for i in cloud.invocations if i.step == "run_shard"]
    assert all(i.error is None for i in runs)
    assert detail["status"] == "FAILED"
    job = cloud.job(detail["job_id"])
    assert job is not None and job.job.status == "FAILED"
    # what the shards had not sent when MarkFailed wrote the outputs is an error of the failed job
    errors = [orjson.loads(line) for line in cloud.read(detail["outputs"]["errors"].split("/", 3)[3]).splitlines()]
    assert len(errors) >= LINES - len(sent) and {e["error"]["code"] for e in errors} == {"job_failed"}
    assert detail["counts"]["results"] + detail["counts"]["errors"] == LINES
