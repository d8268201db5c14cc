"""The local cloud keeps the guarantees of the services it stands in for."""

from __future__ import annotations

import sys
import threading
from typing import Any

import boto3

from sluice_local.cloud import REGION


def test_concurrent_updates_of_one_item_all_count_as_in_dynamodb(make_cloud: Any) -> None:
    """Webhooks settle a shard's items on several threads, each `ADD waiting -1` on one row.
    DynamoDB applies each atomically; a lost one would leave the shard asleep until its poll."""
    cloud = make_cloud()
    table = boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name)
    key = {"pk": "JOB#race", "sk": "SHARD#0"}
    table.put_item(Item={**key, "waiting": 0})
    threads, per_thread = 8, 60

    def settle() -> None:
        for _ in range(per_thread):
            table.update_item(Key=key, UpdateExpression="ADD waiting :m", ExpressionAttributeValues={":m": -1})

    interval = sys.getswitchinterval()
    # switch threads as often as possible, so an unguarded read-modify-write is caught mid-way
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=settle) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert table.get_item(Key=key)["Item"]["waiting"] == -threads * per_thread
