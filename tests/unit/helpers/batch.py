"""What test_batch.py and the tests beside it share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.contract import BatchCollected, Settings
from sluice.contract.model import Request
from sluice.runners.batch.submit import collect_batch
from sluice.send.engine import make_session
from sluice.shard.frame import ShardContext, ShardSpec
from sluice.store.jobs import JobStore

from sluice_local.cloud import LocalCloud
from sluice_local.simulator import SimConfig, SimulatorServer
from tests.conftest import plan_figures, request_line

JOB = "unit-batch-job"


def request(line: int, *, model: str = "gpt-4o-mini", url: str = "/v1/chat/completions", pad: int = 0) -> Request:
    body = {"model": model, "messages": [{"role": "user", "content": "x" * pad}]}
    return Request(line, f"c{line}", "POST", url, orjson.dumps(body))


@dataclass
class Env:
    ctx: ShardContext
    store: JobStore
    sim: SimulatorServer
    s3: Any
    bucket: str

    def shard(self, lines: list[bytes], *, shard: int = 0, **fields: Any) -> ShardSpec:
        key = f"inbox/{JOB}-{shard}.jsonl"
        data = b"".join(lines)
        etag = self.s3.put_object(Bucket=self.bucket, Key=key, Body=data)["ETag"]
        count = len(lines)
        self.store.record_plan(JOB, plan=plan_figures(count), shards=[(shard, count, count)], mode="batch")
        spec = ShardSpec(
            job_id=JOB,
            shard=shard,
            bucket=self.bucket,
            key=key,
            etag=etag,
            start=0,
            end=len(data),
            first_line=1,
            lines=len(lines),
            mode="batch",
            concurrency=8,
            max_attempts=2,
        )
        return replace(spec, **fields)

    def creates(self) -> list[dict[str, Any]]:
        return [e for e in self.sim.log if e["method"] == "POST" and e["path"] == "/v1/batches"]

    def wait_ended(self, spec: ShardSpec) -> BatchCollected:
        deadline = time.monotonic() + 10
        while True:
            outcome = asyncio.run(collect_batch(self.ctx, spec))
            if outcome.done or outcome.fallback:
                return outcome
            assert time.monotonic() < deadline, "the batches never ended"
            time.sleep(0.05)

    def outputs(self, spec: ShardSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        def read(key: str) -> list[dict[str, Any]]:
            data = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            return [orjson.loads(r) for r in data.splitlines()]

        return read(spec.results_key), read(spec.errors_key)


@pytest.fixture
def env() -> Iterator[Env]:
    with SimulatorServer(SimConfig(latency_s=0.0, seed=3, batch_phase_s=0.05)) as sim, mock_aws():
        cloud = LocalCloud(provider_base_url=sim.base_url, api_key="sk-test")
        cloud._create_resources()
        table = boto3.resource("dynamodb", region_name="us-east-1").Table(cloud.table_name)
        store = JobStore(table, ttl_days=1)
        s3 = boto3.client("s3", region_name="us-east-1")
        settings = Settings(
            bucket=cloud.bucket,
            table=cloud.table_name,
            provider_base_url=sim.base_url,
            api_key_secret_arn="a",
            poll_seconds=1,
        )
        ctx = ShardContext(
            s3=s3,
            store=store,
            settings=settings,
            api_key="sk-test",
            remaining_s=lambda: 900.0,
            session_factory=make_session,
        )
        yield Env(ctx, store, sim, s3, cloud.bucket)


def lines(count: int, **kwargs: Any) -> list[bytes]:
    return [request_line(f"u-{n}", "great" if n % 2 else "awful", **kwargs) for n in range(count)]
