"""The local cloud's ledger sees every AWS call of a job, with the step and shard that made it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3

from sluice_local.cloud import REGION, run_job
from sluice_local.quotas import item_size
from tests.conftest import request_line, write_jsonl


def test_every_call_of_a_job_is_recorded_with_its_step_its_shard_and_what_aws_counts(
    make_cloud: Any, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=50, map_concurrency=2)
    path = write_jsonl(tmp_path / "ledger.jsonl", [request_line(f"l-{n}", f"text {n}") for n in range(100)])

    run = run_job(cloud, path)

    assert run.status == "SUCCEEDED"
    calls = [c for c in cloud.calls.calls if c.step != "cloud"]
    assert {"plan", "run_shard", "merge", "notify", "workflow"} <= {c.step for c in calls}
    # a shard's calls carry its Map index, those made on its checkpoint thread too
    shard_calls = [c for c in calls if c.step == "run_shard"]
    assert {c.shard for c in shard_calls} == {0, 1}
    assert any(c.operation == "UpdateItem" for c in shard_calls)
    assert {c.shard for c in calls if c.step in ("plan", "merge", "notify")} == {None}
    assert {(i.step, i.shard) for i in cloud.calls.invocations} >= {("plan", None), ("run_shard", 0), ("run_shard", 1)}
    assert len(cloud.calls.lines) == 100

    # DynamoDB: the size recorded for the last write of an item is the stored item's, by DynamoDB's formula
    table = cloud.table_name
    last = [c for c in calls if c.service == "dynamodb" and c.write_units and c.sk][-1]
    stored = boto3.client("dynamodb", region_name=REGION).get_item(
        TableName=table, Key={"pk": {"S": last.pk}, "sk": {"S": last.sk}}
    )["Item"]
    assert last.item_bytes == item_size(stored)
    assert last.write_units == max(1, -(-item_size(stored) // 1024))

    # S3: the bytes of a PUT are the object's
    results = [
        c for c in calls if c.service == "s3" and c.operation == "PutObject" and c.key.endswith(".results.jsonl")
    ]
    [written] = results
    head = boto3.client("s3", region_name=REGION).head_object(Bucket=written.bucket, Key=written.key)
    assert written.nbytes == head["ContentLength"] > 0 and written.s3_write
