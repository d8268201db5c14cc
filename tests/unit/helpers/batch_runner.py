"""What test_batch_runner.py and the tests beside it share."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.contract import Settings
from sluice.send.engine import make_session
from sluice.shard.frame import ShardContext, ShardSpec
from sluice.store.jobs import JobStore

from sluice_local.cloud import create_table
from tests.conftest import plan_figures, request_line
from tests.unit.fake_batch_api import FakeBatchApi

REGION = "us-east-1"
BUCKET = "jobs-bucket"
JOB = "fake-batch-job"


@dataclass
class Env:
    ctx: ShardContext
    api: FakeBatchApi
    store: JobStore
    s3: Any

    def shard(self, count: int, *, shard: int = 0, **fields: Any) -> ShardSpec:
        key = f"inbox/{JOB}-{shard}.jsonl"
        data = b"".join(request_line(f"u-{n}", "great" if n % 2 else "awful") for n in range(count))
        etag = self.s3.put_object(Bucket=BUCKET, Key=key, Body=data)["ETag"]
        self.store.record_plan(
            JOB, plan=plan_figures(count, mode="batch"), shards=[(shard, count, count)], mode="batch"
        )
        spec = ShardSpec(
            job_id=JOB,
            shard=shard,
            bucket=BUCKET,
            key=key,
            etag=etag,
            start=0,
            end=len(data),
            first_line=1,
            lines=count,
            mode="batch",
            concurrency=8,
            max_attempts=2,
        )
        return replace(spec, **fields)

    def outputs(self, spec: ShardSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        def read(key: str) -> list[dict[str, Any]]:
            return [orjson.loads(r) for r in self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().splitlines()]

        return read(spec.results_key), read(spec.errors_key)

    def report(self, spec: ShardSpec) -> dict[str, Any]:
        return dict(orjson.loads(self.s3.get_object(Bucket=BUCKET, Key=spec.batch_report_key)["Body"].read()))


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        create_table(boto3.client("dynamodb", region_name=REGION), "jobs")
        store = JobStore(boto3.resource("dynamodb", region_name=REGION).Table("jobs"), ttl_days=1)
        # no provider listens here: every batch call goes to the fake
        settings = Settings(bucket=BUCKET, table="jobs", provider_base_url="http://127.0.0.1:9", api_key_secret_arn="-")
        api = FakeBatchApi()
        ctx = ShardContext(s3, store, settings, "sk-test", lambda: 900.0, make_session, batch_api=api.opener())
        yield Env(ctx, api, store, s3)
