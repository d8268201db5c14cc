"""`sluice status` of a deployed job, read from a moto table: the counts are the shard rows summed."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws
from sluice.store import ItemState, JobStore

from local.cloud import create_table
from local.deployed.jobs import describe_job, with_counts


@pytest.fixture
def store() -> Iterator[JobStore]:
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        store = JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table("jobs"), ttl_days=1)
        store.claim_job("job", execution="e", bucket="b", key="inbox/job.jsonl", etag="t", started_at=0.0)
        plan = {"requests": 30, "lines": 30, "mode": "direct"}
        store.record_plan("job", plan=plan, shards=[(s, 10, 10) for s in range(3)], mode="direct", cached={2: 4})
        failed = ItemState(3, "c-3", "failed", attempts=6, error="retries_exhausted: HTTP 500")
        store.record_progress("job", 0, [failed], done=6, failed=1, finished=False, run=1)
        store.record_progress("job", 1, [], done=10, failed=0, finished=True, run=1)
        yield store


def test_status_counts_the_lines_of_every_shard_row(store: JobStore) -> None:
    dep: Any = SimpleNamespace(store=store, env="dev")
    job = store.job("job") or {}

    text = "\n".join(describe_job(dep, job, now=10.0))

    # 6 + 10 done by the shards, 4 answered from the cache by Plan; 1 failed
    assert "lines 30: done 20 · failed 1 · pending 9  [70%]" in text
    assert "shards: 1 DONE, 1 PENDING, 1 RUNNING" in text
    assert with_counts(job, store.shards("job"))["done"] == (store.job_progress("job") or {})["done"] == 20
