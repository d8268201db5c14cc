"""What the shared limit's tests share: a jobs table on moto, a clock and sleep they move by hand
(`FakeTime`), a limit on that table (`shared_limit`) and its item, and the requests they send."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import orjson
from moto import mock_aws
from sluice.contract import RateSeed
from sluice.contract.model import Request
from sluice.limits.lease import Bucket, LeasePolicy
from sluice.limits.shared import SharedLimit, limit_key
from sluice.limits.table import BucketTable
from sluice.providers import OPENAI

from sluice_local.cloud import create_table
from sluice_local.moto_patches import consistent

POLICY = LeasePolicy(min_requests=25, min_period_s=2.0, burst_s=10.0, idle_s=5.0)


@contextmanager
def jobs_table() -> Iterator[Any]:
    """A jobs table on moto, with DynamoDB's single-item atomicity, as the local cloud has it:
    moto's conditional updates from two threads may both pass."""
    with mock_aws(), consistent():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        yield boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")


def request(n: int) -> Request:
    return Request(n, f"r{n}", "POST", "/v1/chat/completions", b'{"model":"gpt-4o-mini"}')


def chat(n: int, content: str = "x" * 40, **extra: Any) -> Request:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **extra}
    return Request(n, f"r{n}", "POST", "/v1/chat/completions", orjson.dumps(body))


class FakeTime:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def shared_limit(table: Any, lessee: str, at: FakeTime, **kwargs: Any) -> SharedLimit:
    return SharedLimit(
        BucketTable(table, clock=at.clock),
        base_url="http://p/v1",
        api_key="sk-x",
        lessee=lessee,
        request_format=OPENAI,
        policy=POLICY,
        clock=at.clock,
        sleep=at.sleep,
        **kwargs,
    )


def limit_item(table: Any) -> Bucket:
    bucket = BucketTable(table).load(limit_key("http://p/v1", "sk-x", "gpt-4o-mini"))
    assert bucket is not None
    return bucket


SEEDS = {"gpt-4o-mini": RateSeed(rpm=1200, tpm=60_000)}


def seated(bucket: Bucket, now: float) -> dict[int, float]:
    """The live seats of a bucket, by seat."""
    return {index: until for index, until in enumerate(bucket.seats) if until > now}
