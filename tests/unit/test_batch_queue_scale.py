"""The Batch queue's shared state at many shards (issue 30): what each shared item holds and takes
does not grow with the shards reserving on it.

Shards submit through `submit_batch` against moto, and every DynamoDB call is counted by its
partition key at botocore, so the figures are what the table would see, whatever the queue's
own bookkeeping.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import Any

import boto3
import orjson
from sluice.runners.batch.submit import submit_batch

from sluice_local.quotas import item_size
from tests.unit.helpers.batch import Env, lines
from tests.unit.helpers.batch import env as batch_env  # noqa: F401  (test_batch's fixture, as `batch_env`)

WRITES = {"PutItem", "UpdateItem", "DeleteItem"}


class Calls:
    """Writes and reads per partition key, counted before each call goes out."""

    def __init__(self, client: Any) -> None:
        self.writes: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        client.meta.events.register("before-call.dynamodb", self.seen)

    def seen(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        name = model.name
        body = orjson.loads(params["body"] or b"{}")
        if name in WRITES or name == "GetItem":
            key = body.get("Key") or body.get("Item") or {}
            (self.writes if name in WRITES else self.reads)[key["pk"]["S"]] += 1
        elif name == "BatchGetItem":
            for ask in body["RequestItems"].values():
                for key in ask["Keys"]:
                    self.reads[key["pk"]["S"]] += 1

    def shared(self, counts: Counter[str]) -> int:
        """The most calls any one key of the queue took (the rate limiter's and queue's `LIMIT#`)."""
        return max((n for pk, n in counts.items() if pk.startswith("LIMIT#")), default=0)


def _queue_item_bytes() -> int:
    client = boto3.client("dynamodb", region_name="us-east-1")
    table = client.list_tables()["TableNames"][0]
    items = client.scan(TableName=table)["Items"]
    return max(item_size(item) for item in items if item["pk"]["S"].startswith("LIMIT#"))


def test_the_queues_items_and_their_writes_stay_the_same_size_however_many_shards_reserve(
    batch_env: Env,  # noqa: F811
) -> None:
    env = batch_env
    calls = Calls(env.store.table.meta.client)
    sizes: list[int] = []
    busiest: list[int] = []
    shard = 0
    for count in (8, 48):
        while shard < count:
            spec = env.shard(lines(2), shard=shard)
            assert asyncio.run(submit_batch(env.ctx, spec)).batches_created == 1
            shard += 1
        sizes.append(_queue_item_bytes())
        busiest.append(calls.shared(calls.writes))
    # every shard's hold is on its own partition: the shared items do not grow with them (a few
    # bytes for a counter's digits)
    assert sizes[1] - sizes[0] <= 16 and sizes[1] <= 1024, sizes
    # 48 shards reserving write no item of the queue once each: the writes spread over its slots
    assert busiest[1] <= math.ceil(48 / 4), busiest
