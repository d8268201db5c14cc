"""Every way a job ends writes its summary the same way: Merge, MarkFailed (merged, or the summary
alone when Plan failed or MarkFailed itself did) and a cancel (merged, or while planning)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.merge.mark_failed import mark_failed, record_failure
from sluice.merge.merge import merge_job
from sluice.runners.cancel import cancel_job
from sluice.store.jobs import JobStore

from sluice_local.cloud import create_table
from tests.unit.helpers.failure import BUCKET, JOB, LINES, failed_job

# what `sluice run`, `sluice results`, the report and `sluice cancel` read of a merged job
READ_OF_A_MERGED_JOB = {
    "job_id",
    "status",
    "input",
    "outputs",
    "counts",
    "lines_by_path",
    "errors_by_code",
    "error_examples",
    "tokens",
    "retries",
    "throttled",
    "sweep",
    "cache",
    "latency_s",
    "latency_histogram",
    "timeline",
    "started_at",
    "wall_seconds",
    "mode",
    "shards",
    "cost_estimate_usd",
    "max_error_rate",
    "provider_refused",
}
# what a job that ended before it had shards says
STUB = {"job_id", "status", "error", "input"}


class Ended:
    """No execution left to stop: a cancel goes straight to the job's outputs."""

    def describe_execution(self, executionArn: str) -> dict[str, str]:
        return {"status": "SUCCEEDED"}


def merged(s3: Any, store: JobStore) -> None:
    merge_job(s3=s3, store=store, state=failed_job(s3, store, shards=2, done={0: LINES, 1: LINES}, part_rows=4))


def failed(s3: Any, store: JobStore) -> None:
    state = failed_job(s3, store, shards=2, done={0: LINES, 1: 3}, part_rows=4)
    mark_failed(s3=s3, store=store, state=state, error="States.TaskFailed", cause="shard 1 failed")


def cancelled(s3: Any, store: JobStore) -> None:
    failed_job(s3, store, shards=2, done={0: LINES}, part_rows=4)
    cancel_job(s3=s3, store=store, sfn=Ended(), job_id=JOB, provider=lambda: ("-", "-"))


def plan_failed(s3: Any, store: JobStore) -> None:
    state = {"detail": {"bucket": {"name": BUCKET}, "object": {"key": "inbox/failed.jsonl", "etag": "e"}}}
    mark_failed(s3=s3, store=store, state=state, error="PlanError", cause="bad option")


def mark_failed_failed(s3: Any, store: JobStore) -> None:
    state = failed_job(s3, store, shards=2, done={0: LINES}, part_rows=4)
    again = {"Error": "Sandbox.Timedout", "Cause": ""}
    record_failure(s3=s3, store=store, state=state, error="States.TaskFailed", cause="", failed_again=again)


def cancelled_while_planning(s3: Any, store: JobStore) -> None:
    store.claim_job(JOB, execution="x", bucket=BUCKET, key="inbox/failed.jsonl", etag='"e"', started_at=1.0)
    cancel_job(s3=s3, store=store, sfn=Ended(), job_id=JOB, provider=lambda: ("-", "-"))


# MarkFailed's last resort accounts for every line from the input: its summary is a merged job's
MERGED = {"merge": merged, "mark_failed": failed, "cancel": cancelled, "record_failure": mark_failed_failed}
STUBS = {
    "mark_failed_plan": plan_failed,
    "cancel_planning": cancelled_while_planning,
}


def end(how: Callable[[Any, JobStore], None]) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any] | None]:
    """Run one way of ending the job on moto: each summary write it made (its key and content
    type), the summary it left, and what the job row kept of it."""
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        store = JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table("jobs"), ttl_days=1)
        writes: list[dict[str, Any]] = []

        def record(params: dict[str, Any], **_: object) -> None:
            if str(params.get("Key", "")).endswith(".summary.json"):
                writes.append({"key": params["Key"], "content_type": params.get("ContentType")})

        s3.meta.events.register("provide-client-params.s3.PutObject", record)
        how(s3, store)
        summary = orjson.loads(s3.get_object(Bucket=BUCKET, Key="outbox/failed.summary.json")["Body"].read())
        row = store.job(summary["job_id"])
        return writes, summary, None if row is None or row.summary is None else row.summary.to_json()


@pytest.mark.parametrize("how", [*MERGED.values(), *STUBS.values()], ids=[*MERGED, *STUBS])
def test_each_way_a_job_ends_writes_its_summary_once_as_json(how: Callable[[Any, JobStore], None]) -> None:
    writes, _, _ = end(how)
    assert writes == [{"key": "outbox/failed.summary.json", "content_type": "application/json"}]


def test_a_merged_job_reads_the_same_however_it_ended() -> None:
    ended = {name: end(how) for name, how in MERGED.items()}
    keys = {name: set(summary) for name, (_, summary, _) in ended.items()}
    # a failed or cancelled job says why, and is otherwise the same summary as a merged one
    assert keys["merge"] >= READ_OF_A_MERGED_JOB and "error" not in keys["merge"]
    assert keys["mark_failed"] == keys["cancel"] == keys["record_failure"] == keys["merge"] | {"error"}
    for _, summary, row in ended.values():
        assert row == {key: summary[key] for key in ("counts", "outputs", "wall_seconds")}


def test_a_job_that_ended_before_its_shards_reads_the_same_however_it_ended() -> None:
    for how in STUBS.values():
        _, summary, row = end(how)
        assert set(summary) == STUB and summary["status"] in ("FAILED", "CANCELLED")
        # Plan failed before it made the job's row: there is none to end
        assert row is None if how is plan_failed else row == {"error": summary["error"]}
