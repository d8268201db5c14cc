"""MarkFailed on moto: what it costs a failed job, and that it always ends the job."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.merge import mark_failed as failure
from sluice.merge.mark_failed import mark_failed, record_failure
from sluice.store.jobs import JobStore

from sluice_local.cloud import create_table
from tests.unit.helpers.failure import BUCKET, JOB, LINES, failed_job


class Counted:
    """The S3 client, and each call it makes with the key it names."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: list[tuple[str, str]] = []
        client.meta.events.register("provide-client-params.s3.*", self._record)

    def _record(self, params: dict[str, Any], model: Any, **_: object) -> None:
        self.calls.append((model.name, str(params.get("Key") or params.get("Prefix") or "")))


@pytest.fixture
def aws() -> Iterator[tuple[Counted, JobStore]]:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        table = boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")
        yield Counted(s3), JobStore(table, ttl_days=1)


def job_status(store: JobStore) -> str | None:
    job = store.job(JOB)
    return job.status if job else None


def outputs(s3: Any, kind: str) -> list[dict[str, Any]]:
    body = s3.get_object(Bucket=BUCKET, Key=f"outbox/failed.{kind}.jsonl")["Body"].read()
    return [orjson.loads(row) for row in body.splitlines()]


@pytest.mark.parametrize("part_rows", [1, LINES])
def test_mark_failed_reads_no_part_of_a_shard_that_finished(aws: tuple[Counted, JobStore], part_rows: int) -> None:
    """What MarkFailed costs grows with the shards cut short, not with the parts every shard left:
    a job whose finished shards left a part a line costs it what one with a part a shard does."""
    counted, store = aws
    s3 = counted.client
    # shards 0-2 finished; the failure cut shard 3 short after 5 lines; shard 4 never ran
    state = failed_job(s3, store, shards=5, done={0: LINES, 1: LINES, 2: LINES, 3: 5}, part_rows=part_rows)
    counted.calls.clear()

    failed = mark_failed(s3=s3, store=store, state=state, error="States.TaskFailed", cause="")
    calls = list(counted.calls)

    # the "Sluice Job Failed" event's detail
    assert failed.event is not None and failed.event.to_json() == {
        "job_id": JOB,
        "status": "FAILED",
        "error": "States.TaskFailed",
        "counts": {"lines": 60, "blank": 0, "requests": 60, "results": 41, "errors": 19},
        "outputs": {
            "results": f"s3://{BUCKET}/outbox/failed.results.jsonl",
            "errors": f"s3://{BUCKET}/outbox/failed.errors.jsonl",
            "summary": f"s3://{BUCKET}/outbox/failed.summary.json",
        },
    }
    assert [r["custom_id"] for r in outputs(s3, "results")] == [f"c-{n}" for n in range(1, 42)]
    assert {e["error"]["code"] for e in outputs(s3, "errors")} == {"job_failed"}
    parts_read = [k for op, k in calls if op == "GetObject" and "/part-" in k]
    # only the shard cut short, each of its parts and their figures once
    assert all(k.startswith(f"jobs/{JOB}/shards/00003/") for k in parts_read)
    assert sorted(Counter(parts_read).values()) == [1] * len(parts_read) == [1] * (2 * -(-5 // part_rows))
    # and the same requests whatever the finished shards left: the manifest, each shard's figures,
    # for the two shards cut short a list, their input and 3 writes, a read of each non-empty
    # shard output and a write of each output, and the summary
    assert len(calls) - len(parts_read) == 1 + 5 + 2 * 5 + (4 + 1) + (2 + 1) + 1
    assert failed.result.done


def test_mark_failed_out_of_time_leaves_the_shards_left_for_its_next_call(aws: tuple[Counted, JobStore]) -> None:
    counted, store = aws
    s3 = counted.client
    state = failed_job(s3, store, shards=3, done={0: LINES, 1: 3}, part_rows=2)

    first = mark_failed(s3=s3, store=store, state=state, error="States.TaskFailed", cause="", remaining_s=0.0)

    assert first.to_dict() == {"job_id": JOB, "status": "FAILED", "done": False, "shards_left": 2, "refused": False}
    assert job_status(store) == "PLANNING"
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="outbox/")

    second = mark_failed(s3=s3, store=store, state=state, error="States.TaskFailed", cause="", remaining_s=900.0)

    assert second.event is not None and second.event.counts is not None
    assert second.result.done and second.event.counts.results == LINES + 3
    assert len(outputs(s3, "results")) + len(outputs(s3, "errors")) == 3 * LINES
    assert job_status(store) == "FAILED"


def test_a_mark_failed_call_that_assembled_for_long_leaves_the_merge_to_the_next(
    aws: tuple[Counted, JobStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Assembling and merging a large job in one call would take two steps' time; the next call
    finds every shard finished, assembles nothing, and merges."""
    counted, store = aws
    s3 = counted.client
    state = failed_job(s3, store, shards=2, done={0: LINES, 1: 3}, part_rows=2)
    monkeypatch.setattr(failure, "MERGE_AFTER_SHARE", 0.0)

    first = mark_failed(s3=s3, store=store, state=state, error="States.TaskFailed", cause="", remaining_s=900.0)

    assert first.to_dict() == {"job_id": JOB, "status": "FAILED", "done": False, "shards_left": 0, "refused": False}
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="outbox/")
    counted.calls.clear()

    second = mark_failed(s3=s3, store=store, state=state, error="States.TaskFailed", cause="", remaining_s=900.0)

    assert second.event is not None and second.event.counts is not None
    assert second.result.done and second.event.counts.results == LINES + 3
    assert not [k for _, k in counted.calls if "/part-" in k]


def test_when_mark_failed_fails_its_last_resort_still_accounts_for_every_line_from_the_input(
    aws: tuple[Counted, JobStore],
) -> None:
    """Whatever made MarkFailed fail (a step out of time, an assembly that raised), its last resort
    writes every line to errors from the input alone, naming both causes, and the job ends FAILED."""
    counted, store = aws
    s3 = counted.client
    state = failed_job(s3, store, shards=2, done={0: LINES}, part_rows=4)
    timed_out = {"Error": "Sandbox.Timedout", "Cause": '{"errorMessage": "Task timed out after 900.00 seconds"}'}
    counted.calls.clear()

    failed = record_failure(
        s3=s3, store=store, state=state, error="States.TaskFailed", cause="shard 1 failed", failed_again=timed_out
    )

    reason = (
        "States.TaskFailed: shard 1 failed; accounting for its lines failed too: "
        "Sandbox.Timedout: Task timed out after 900.00 seconds"
    )
    answer = failed.to_dict()
    assert (answer["status"], answer["error"], answer["done"]) == ("FAILED", reason, True)
    assert answer["counts"] == {
        "lines": 2 * LINES,
        "blank": 0,
        "requests": 2 * LINES,
        "results": 0,
        "errors": 2 * LINES,
    }
    errors = outputs(s3, "errors")
    assert [e["line"] for e in errors] == list(range(1, 2 * LINES + 1))
    assert {e["error"]["code"] for e in errors} == {"job_failed"} and outputs(s3, "results") == []
    assert all(reason in e["error"]["message"] for e in errors)
    summary = orjson.loads(s3.get_object(Bucket=BUCKET, Key="outbox/failed.summary.json")["Body"].read())
    assert summary["status"] == "FAILED" and summary["error"] == reason
    assert summary["errors_by_code"] == {"job_failed": 2 * LINES}
    job = store.job(JOB)
    assert job is not None and job.status == "FAILED" and job.summary is not None
    assert job.summary.counts is not None and job.summary.counts.errors == 2 * LINES


def test_a_last_resort_that_cannot_read_the_input_ends_the_job_with_a_summary_that_says_why(
    aws: tuple[Counted, JobStore],
) -> None:
    counted, store = aws
    s3 = counted.client
    state = failed_job(s3, store, shards=2, done={0: LINES}, part_rows=4)
    s3.delete_object(Bucket=BUCKET, Key=state.key)
    timed_out = {"Error": "Sandbox.Timedout", "Cause": '{"errorMessage": "Task timed out after 900.00 seconds"}'}

    failed = record_failure(
        s3=s3, store=store, state=state, error="States.TaskFailed", cause="shard 1 failed", failed_again=timed_out
    )

    assert failed.event is not None and failed.event.summary == f"s3://{BUCKET}/outbox/failed.summary.json"
    summary = orjson.loads(s3.get_object(Bucket=BUCKET, Key="outbox/failed.summary.json")["Body"].read())
    assert summary["status"] == "FAILED"
    assert "writing its lines from the input failed" in summary["error"] and "NoSuchKey" in summary["error"]


@pytest.mark.parametrize(
    ("error", "cause", "refused"),
    [
        # as Step Functions hands a Lambda's raised PlanError over
        (
            "PlanError",
            orjson.dumps({"errorType": "PlanError", "errorMessage": "sluice-mode"}).decode(),
            True,
        ),
        # a name Step Functions gave, with the Lambda's own type in the cause
        ("States.TaskFailed", orjson.dumps({"errorType": "PlanError", "errorMessage": "no"}).decode(), True),
        ("States.TaskFailed", orjson.dumps({"errorType": "KeyError", "errorMessage": "'detail'"}).decode(), False),
        ("Lambda.Unknown", "", False),
    ],
)
def test_a_job_plan_refused_for_its_users_input_is_refused_not_failed(
    aws: tuple[Counted, JobStore], error: str, cause: str, refused: bool
) -> None:
    s3, store = aws
    event = {"detail": {"bucket": {"name": BUCKET}, "object": {"key": "inbox/x.jsonl", "etag": "e"}}}
    ended = mark_failed(s3=s3.client, store=store, state=event, error=error, cause=cause)
    assert ended.to_dict()["done"] is True and ended.event is not None and ended.event.status == "FAILED"
    assert ended.to_dict()["refused"] is refused
