"""AWS's quotas, asserted by the local cloud: what AWS would refuse fails here first, named."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from sluice_local import quotas
from sluice_local.cloud import ACCOUNT, REGION, run_job
from tests.conftest import request_line, write_jsonl


def padded(handler: Any, pad: int) -> Any:
    def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return {**handler(event, context), "pad": "x" * pad}

    return handle


def test_a_state_output_over_256_kib_fails_the_execution_past_its_catch(make_cloud, tmp_path, monkeypatch) -> None:
    from sluice_handlers import plan

    cloud = make_cloud()
    monkeypatch.setattr(plan, "handler", padded(plan.handler, 300_000))
    run = run_job(cloud, write_jsonl(tmp_path / "big.jsonl", [request_line("a")]))

    assert run.status == "FAILED"
    assert run.execution["error"] == "States.DataLimitExceeded"
    assert "AWS quota: Step Functions task result is 262,144 bytes (256 KiB)" in run.execution["cause"]
    assert "; Plan returned 300,3" in run.execution["cause"]
    # States.ALL does not catch it on AWS: MarkFailed never runs
    assert not [i for i in cloud.invocations if i.step == "mark_failed"]


def test_the_old_map_definition_fails_on_its_gathered_result(make_cloud, tmp_path, monkeypatch) -> None:
    """Defect 2: children that end with their whole state (~450 B) overflow the Map's own
    result at ~580 shards; the Map's Catch does not help."""
    from sluice.contract import definition

    shard_states = definition._shard_states

    def old_states() -> dict[str, Any]:
        states = shard_states()
        states["States"]["Shard finished"] = {"Type": "Succeed"}
        return states

    monkeypatch.setattr(definition, "_shard_states", old_states)
    cloud = make_cloud(shard_lines=1, map_concurrency=20, concurrency=4)
    # a deep key (S3 allows 1,024 bytes) makes each child's state ~1.4 KB: 200 shards overflow
    key = "inbox/" + "nested/" * 140 + "reviews.jsonl"
    path = write_jsonl(tmp_path / "many.jsonl", [request_line(f"m-{n}") for n in range(200)])
    run = run_job(cloud, path, key=key)

    assert run.status == "FAILED"
    assert run.execution["error"] == "States.DataLimitExceeded"
    assert "the Distributed Map gathered 200 child outputs into" in run.execution["cause"]
    assert cloud.quotas.gathered_bytes > quotas.STATE_PAYLOAD_BYTES


def test_send_task_success_output_is_capped(make_cloud) -> None:
    make_cloud()
    sfn = boto3.client("stepfunctions", region_name=REGION)
    with pytest.raises(ClientError) as caught:
        sfn.send_task_success(taskToken="t" * 10, output=json.dumps({"x": "y" * 300_000}))
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "AWS quota: SendTaskSuccess output is 262,144 bytes (256 KiB)" in str(caught.value)


def test_a_lambda_response_over_6_mb_fails_the_step(make_cloud, tmp_path, monkeypatch) -> None:
    from sluice_handlers import plan

    cloud = make_cloud()
    monkeypatch.setattr(plan, "handler", padded(plan.handler, 7_000_000))
    run = run_job(cloud, write_jsonl(tmp_path / "huge.jsonl", [request_line("a")]))

    assert run.status == "FAILED"
    failed = next(i for i in cloud.invocations if i.step == "plan")
    assert "AWS quota: Lambda response payload (synchronous) is 6,291,456 bytes (6 MiB); plan returned" in str(
        failed.error
    )


def test_history_over_25_000_events_fails_the_execution(make_cloud) -> None:
    """The counter runs under every state the interpreter enters; a tight loop reaches the cap."""
    cloud = make_cloud()
    sfn = boto3.client("stepfunctions", region_name=REGION)
    loop = {
        "StartAt": "Count",
        "States": {
            "Count": {"Type": "Pass", "Next": "Again?"},
            "Again?": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.stop", "BooleanEquals": True, "Next": "Done"}],
                "Default": "Count",
            },
            "Done": {"Type": "Succeed"},
        },
    }
    role = f"arn:aws:iam::{ACCOUNT}:role/loop"
    machine = sfn.create_state_machine(name="loop", definition=json.dumps(loop), roleArn=role)
    arn = sfn.start_execution(stateMachineArn=machine["stateMachineArn"], input='{"stop": false}')["executionArn"]
    described = cloud.wait(arn, timeout_s=120)

    assert described["status"] == "FAILED"
    assert described["error"] == "States.Runtime"
    assert (
        "AWS quota: Step Functions execution history is 25,000 events; the execution reached 25,00"
        in (described["cause"])
    )


def test_a_background_shard_stays_under_the_history_cap_for_24_hours(make_cloud, simulator, tmp_path) -> None:
    """Defect 5: measure the events one AwaitWebhooks -> Collect loop records, then count the
    loops the poll schedule makes in 24 hours (after which a response is reported expired)."""
    from sluice.contract import Settings
    from sluice.runners.background import BACKGROUND_MAX_WAIT_S
    from sluice.shard.frame import poll_wait_seconds

    simulator.configure(latency_s=2.5, webhook_drop_rate=1.0)
    cloud = make_cloud(shard_lines=10, concurrency=10, poll_seconds=1)
    path = write_jsonl(tmp_path / "bg.jsonl", [request_line(f"b-{n}", url="/v1/responses") for n in range(10)])
    run = run_job(cloud, path, metadata={"sluice-mode": "background"})
    assert run.status == "SUCCEEDED" and len(run.results) == 10
    collects = sum(1 for i in cloud.invocations if i.step == "collect")
    assert collects >= 2
    events = cloud.quotas.child_peak()
    # Start, Answered from the cache?, Take a slot, Slot taken?, Which mode?, Submit, Submitted?, then
    # per loop AwaitWebhooks, Collect, Collected?, and at the end Give the slot back
    fixed = (quotas.EXECUTION_EVENTS + 4 * quotas.STATE_EVENTS + quotas.TASK_ATTEMPT_EVENTS + quotas.STATE_EVENTS) + (
        3 * quotas.STATE_EVENTS + 2 * quotas.TASK_ATTEMPT_EVENTS
    )
    per_loop = (events - fixed) / collects
    assert per_loop == 3 * quotas.STATE_EVENTS + quotas.CALLBACK_ATTEMPT_EVENTS + quotas.TASK_ATTEMPT_EVENTS == 13

    def loops(wait: Any) -> int:
        elapsed, count = 0.0, 0
        while elapsed <= BACKGROUND_MAX_WAIT_S:
            elapsed += wait(elapsed)
            count += 1
        return count + 1

    settings = Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="a", poll_seconds=10)
    worst = fixed + per_loop * loops(lambda elapsed: poll_wait_seconds(settings, elapsed))
    assert worst < quotas.HISTORY_EVENTS / 5
    # the fixed 10 s poll this replaces: past the cap in under 6 hours
    assert fixed + per_loop * loops(lambda elapsed: 10) > 4 * quotas.HISTORY_EVENTS


def test_a_lambda_past_its_timeout_fails_like_lambda(make_cloud, tmp_path, monkeypatch) -> None:
    from sluice_handlers import run_shard

    cloud = make_cloud(lambda_timeout_s=5.0, safety_margin_s=0.1, request_timeout_s=0.5)
    handler = run_shard.handler
    slow = {"left": 1}

    def overrun(event: dict[str, Any], context: Any) -> dict[str, Any]:
        answer = handler(event, context)
        if slow["left"]:
            slow["left"] -= 1
            time.sleep(5.5)
        return answer

    monkeypatch.setattr(run_shard, "handler", overrun)
    run = run_job(cloud, write_jsonl(tmp_path / "t.jsonl", [request_line(f"t-{n}") for n in range(5)]))

    assert run.status == "SUCCEEDED" and len(run.results) == 5
    timed_out = [i for i in cloud.invocations if i.step == "run_shard" and i.error]
    assert len(timed_out) == 1
    assert "AWS quota: Lambda timeout for run_shard is 5 s as configured; the handler ran " in str(timed_out[0].error)


def test_a_step_past_its_memory_fails_like_lambda(make_cloud, tmp_path, monkeypatch) -> None:
    """Merge runs alone in the process, so its peak is its own: 1,100 MB more than the
    runtime's is past the 1,024 MB the stack gives it."""
    from sluice_handlers import merge

    cloud = make_cloud()
    handler = merge.handler

    def hungry(event: dict[str, Any], context: Any) -> dict[str, Any]:
        held = b"m" * (1100 * quotas.MIB)
        answer = handler(event, context)
        del held
        return answer

    monkeypatch.setattr(merge, "handler", hungry)
    run = run_job(cloud, write_jsonl(tmp_path / "m.jsonl", [request_line(f"m-{n}") for n in range(3)]))

    assert run.status == "FAILED"
    failed = [i for i in cloud.invocations if i.step == "merge" and i.error]
    assert failed
    assert "AWS quota: Lambda memory for merge is 1,024 MB as configured; it used 1,1" in str(failed[0].error)
    assert cloud.quotas.breaches and cloud.quotas.breaches[0].startswith("AWS quota: Lambda memory for merge")


def test_steps_that_run_alone_are_measured_within_their_memory(make_cloud, tmp_path) -> None:
    cloud = make_cloud()
    run = run_job(cloud, write_jsonl(tmp_path / "m.jsonl", [request_line(f"m-{n}") for n in range(50)]))

    assert run.status == "SUCCEEDED" and not cloud.quotas.breaches
    peaks = cloud.quotas.memory_peaks
    assert {"plan", "run_shard", "merge"} <= set(peaks)
    assert all(quotas.LAMBDA_RUNTIME_MB * quotas.MIB <= peaks[step] < 256 * quotas.MIB for step in peaks)


def test_one_shard_stays_within_lambdas_file_descriptors(make_cloud, simulator, tmp_path) -> None:
    """Defect 4: a one-shard job used to get all 1,000 connections; counted at the peak with
    the SDK pools and the runtime's own, that is more than Lambda's 1,024."""
    from sluice.limits.flow import MAX_SHARD_CONNECTIONS

    # slow enough answers that every connection the shard may open is open at once
    simulator.configure(latency_s=5.0)
    cloud = make_cloud(shard_lines=3000, concurrency=1000, map_concurrency=1, request_timeout_s=30.0)
    run = run_job(cloud, write_jsonl(tmp_path / "one.jsonl", [request_line(f"f-{n}") for n in range(1500)]))

    assert run.status == "SUCCEEDED" and len(run.results) == 1500
    assert not cloud.quotas.breaches
    peak = cloud.quotas.fd_peaks["run_shard"]
    assert MAX_SHARD_CONNECTIONS < peak <= quotas.LAMBDA_FILE_DESCRIPTORS


def test_more_connections_than_descriptors_fail_the_shard_loudly(make_cloud, simulator, tmp_path, monkeypatch) -> None:
    from sluice.plan import plan

    monkeypatch.setattr(plan, "MAX_SHARD_CONNECTIONS", 1000)
    # answers slow enough that no connection is free for reuse before the shard has opened them
    # all, however slowly a busy machine opens them (the breach ends the shard long before); and a
    # request timeout past the latency, or the first requests time out and free their connections
    simulator.configure(latency_s=20.0)
    cloud = make_cloud(shard_lines=3000, concurrency=1000, map_concurrency=1, max_attempts=1, request_timeout_s=60.0)
    run = run_job(cloud, write_jsonl(tmp_path / "one.jsonl", [request_line(f"f-{n}") for n in range(1500)]))

    # the shard fails, and its job says why: never SUCCEEDED, and FAILED past its error rate (0) when
    # its lines failed with it
    assert run.summary["status"] in ("COMPLETED_WITH_ERRORS", "FAILED") and run.errors
    assert cloud.quotas.breaches[0].startswith("AWS quota: Lambda file descriptors are 1,024; run_shard held 1,025")
    failed = [i for i in cloud.invocations if i.step == "run_shard" and i.error]
    assert failed and "AWS quota: Lambda file descriptors" in str(failed[0].error)
    assert "AWS quota: Lambda file descriptors" in run.summary["error"]
    (shard,) = run.summary["shards"]
    assert "AWS quota: Lambda file descriptors" in shard["failure"]


def test_dynamodb_item_and_batch_quotas(make_cloud) -> None:
    cloud = make_cloud()
    ddb = boto3.client("dynamodb", region_name=REGION)

    def row(n: int, pad: int = 0) -> dict[str, Any]:
        return {"pk": {"S": "JOB#q"}, "sk": {"S": f"ITEM#{n:05d}"}, "body": {"S": "x" * pad}}

    with pytest.raises(ClientError) as caught:
        ddb.put_item(TableName=cloud.table_name, Item=row(0, 410_000))
    assert "AWS quota: DynamoDB item size is 409,600 bytes (400 KiB); PutItem wrote an item of 410,0" in str(
        caught.value
    )

    puts = [{"PutRequest": {"Item": row(n)}} for n in range(26)]
    with pytest.raises(ClientError) as caught:
        ddb.batch_write_item(RequestItems={cloud.table_name: puts})
    assert "AWS quota: DynamoDB BatchWriteItem takes at most 25 requests; got 26" in str(caught.value)
    ddb.batch_write_item(RequestItems={cloud.table_name: puts[:25]})

    def transaction(n: int) -> list[dict[str, Any]]:
        return [{"Put": {"TableName": cloud.table_name, "Item": row(1000 + i)}} for i in range(n)]

    # moto's own cap is DynamoDB's old 25; AWS takes 100
    ddb.transact_write_items(TransactItems=transaction(100))
    with pytest.raises(ClientError) as caught:
        ddb.transact_write_items(TransactItems=transaction(101))
    assert "AWS quota: DynamoDB TransactWriteItems takes at most 100 actions; got 101" in str(caught.value)


def test_s3_multipart_quotas_use_aws_numbers_even_if_moto_was_told_otherwise(make_cloud, monkeypatch) -> None:
    from moto.s3 import models

    cloud = make_cloud()
    # what a test elsewhere (or S3_UPLOAD_PART_MIN_SIZE) may have set before the local cloud started
    monkeypatch.setattr(models, "S3_UPLOAD_PART_MIN_SIZE", 256)
    s3 = boto3.client("s3", region_name=REGION)
    upload = s3.create_multipart_upload(Bucket=cloud.bucket, Key="small")["UploadId"]
    parts = []
    for number, body in ((1, b"a" * 1024), (2, b"b" * 10)):
        etag = s3.upload_part(Bucket=cloud.bucket, Key="small", UploadId=upload, PartNumber=number, Body=body)["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    with pytest.raises(ClientError) as caught:
        s3.complete_multipart_upload(
            Bucket=cloud.bucket, Key="small", UploadId=upload, MultipartUpload={"Parts": parts}
        )
    assert caught.value.response["Error"]["Code"] == "EntityTooSmall"
    assert "AWS quota: S3 multipart minimum part size (all but the last) is 5,242,880 bytes (5 MiB)" in str(
        caught.value
    )

    s3.put_object(Bucket=cloud.bucket, Key="src", Body=b"x" * 100)
    with pytest.raises(ClientError) as caught:
        s3.upload_part_copy(
            Bucket=cloud.bucket, Key="small", UploadId=upload, PartNumber=10_001, CopySource=f"{cloud.bucket}/src"
        )
    assert "AWS quota: S3 multipart upload has at most 10,000 parts; got part number 10001" in str(caught.value)


def test_an_eventbridge_entry_over_256_kb_is_refused(make_cloud) -> None:
    make_cloud()
    events = boto3.client("events", region_name=REGION)
    entry = {"Source": "sluice", "DetailType": "Sluice Job Completed", "Detail": json.dumps({"x": "y" * 270_000})}
    with pytest.raises(ClientError) as caught:
        events.put_events(Entries=[entry])
    assert "AWS quota: EventBridge PutEvents entry size is 262,144 bytes (256 KiB)" in str(caught.value)


@pytest.mark.scale
def test_twelve_thousand_lines_in_1200_shards(make_cloud, tmp_path: Path) -> None:
    """The scale the Map must carry: every line accounted for, every quota enforced."""
    # 20 shards share one process and its GIL with the simulator: a request may wait its turn
    cloud = make_cloud(shard_lines=10, map_concurrency=20, concurrency=200, request_timeout_s=60.0)
    path = write_jsonl(tmp_path / "wide.jsonl", [request_line(f"w-{n}") for n in range(12_000)])
    started = time.monotonic()
    run = run_job(cloud, path)
    seconds = time.monotonic() - started

    assert run.status == "SUCCEEDED", run.execution.get("cause")
    report = run.verify(path)
    assert report.ok, report.describe()
    assert report.results + report.errors == 12_000 and len(run.summary["shards"]) == 1200
    assert not run.errors, run.errors[:3]
    assert not cloud.quotas.breaches
    assert 0 < cloud.quotas.gathered_bytes < quotas.STATE_PAYLOAD_BYTES / 10
    print(f"12,000 lines in 1,200 shards: {seconds:.1f} s")


def test_an_s3_object_moto_spills_to_disk_is_not_the_steps_tmp(make_cloud) -> None:
    """moto keeps an object over 5 MiB in a temporary file: S3's disk on AWS, not the Lambda's."""
    import tempfile

    cloud = make_cloud()
    s3 = boto3.client("s3", region_name=REGION)
    with quotas.invocation(cloud.quotas, "merge") as (_, tmp):
        s3.put_object(Bucket=cloud.bucket, Key="jobs/big", Body=b"x" * (6 << 20))
        assert not list(tmp.files)
        # the step's own temporary file still counts
        with tempfile.TemporaryFile() as own:
            own.write(b"y")
            assert len(list(tmp.files)) == 1
    assert s3.head_object(Bucket=cloud.bucket, Key="jobs/big")["ContentLength"] == 6 << 20


def test_a_batch_file_spilled_past_tmp_fails_like_a_full_disk(make_cloud) -> None:
    """The smallest unit: a step's invocation on the local cloud, spilling its batch file."""
    import tempfile

    cloud = make_cloud()
    with (
        quotas.invocation(cloud.quotas, "submit_batch") as (_, tmp),
        tempfile.SpooledTemporaryFile(max_size=1024) as spool,
    ):
        spool.write(b"x" * 2048)
        spool.seek(quotas.LAMBDA_TMP_BYTES)
        with pytest.raises(OSError) as caught:
            spool.write(b"y")
    assert "AWS quota: Lambda /tmp is 536,870,912 bytes (512 MiB) as configured; submit_batch wrote 536,870,913" in str(
        caught.value
    )
    assert tmp.message == cloud.quotas.breaches[-1]


def test_a_batch_shard_waiting_10_days_stays_under_half_the_history_cap(make_cloud, simulator, tmp_path) -> None:
    """Measure the events one AwaitBatch -> CollectBatch loop records in the local cloud, then count
    the loops the poll schedule makes while a batch stays unfinished for 10 days (a Bedrock job may
    wait and run for a week, and 2,000 jobs at 20 a model queue for longer)."""
    from sluice.contract import Settings
    from sluice.runners.batch.advance import batch_wait_seconds

    # no webhooks and batches that take a few polls: the shard loops on its own
    simulator.configure(batch_phase_s=1.5)
    cloud = make_cloud(shard_lines=10, poll_seconds=1)
    path = write_jsonl(tmp_path / "wait.jsonl", [request_line(f"w-{n}") for n in range(10)])
    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})
    assert run.status == "SUCCEEDED" and len(run.results) == 10
    collects = sum(1 for i in cloud.invocations if i.step == "collect_batch")
    assert collects >= 2
    events = cloud.quotas.child_peak()
    # per loop: AwaitBatch (a callback attempt), CollectBatch (a task attempt), its Choice
    per_loop = 3 * quotas.STATE_EVENTS + quotas.CALLBACK_ATTEMPT_EVENTS + quotas.TASK_ATTEMPT_EVENTS
    fixed = events - per_loop * collects
    assert 0 < fixed < 100 and per_loop == 13

    def loops(wait: Any, days: float) -> int:
        elapsed, count = 0.0, 0
        while elapsed <= days * 86_400:
            elapsed += wait(elapsed)
            count += 1
        return count + 1

    settings = Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="a", poll_seconds=10)
    for days in (10, 30):
        worst = fixed + per_loop * loops(lambda elapsed: batch_wait_seconds(settings, elapsed), days)
        assert worst < quotas.HISTORY_EVENTS / 2, f"{days} days: {worst:,} events"
    # the schedule this replaces, capped at batch_poll_max_s: past the cap in under 7 days
    capped = fixed + per_loop * loops(lambda e: max(10, min(settings.batch_poll_max_s, e / 10)), 10)
    assert capped > quotas.HISTORY_EVENTS
