"""`sluice status` of a deployed job, read from a moto table: the counts are the shard rows summed."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws
from sluice.merge.merge import merge_job
from sluice.store.jobs import ItemState, JobStore

from sluice_local.cloud import create_table
from sluice_local.deployed.jobs import describe_job, status_json, with_counts
from tests.conftest import plan_figures
from tests.unit.helpers.failure import BUCKET, JOB, LINES, failed_job


@pytest.fixture
def store() -> Iterator[JobStore]:
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        store = JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table("jobs"), ttl_days=1)
        store.claim_job("job", execution="e", bucket="b", key="inbox/job.jsonl", etag="t", started_at=0.0)
        store.record_plan(
            "job", plan=plan_figures(30), shards=[(s, 10, 10) for s in range(3)], mode="direct", cached={2: 4}
        )
        failed = ItemState(3, "c-3", "failed", attempts=6, error="retries_exhausted: HTTP 500")
        store.record_progress("job", 0, [failed], done=6, failed=1, finished=False, run=1)
        store.record_progress("job", 1, [], done=10, failed=0, finished=True, run=1)
        yield store


def test_status_counts_the_lines_of_every_shard_row(store: JobStore) -> None:
    dep: Any = SimpleNamespace(store=store, env="dev")
    job = store.job("job")
    assert job is not None

    text = "\n".join(describe_job(dep, job, now=10.0))

    # 6 + 10 done by the shards, 4 answered from the cache by Plan; 1 failed
    assert "lines 30: done 20 · failed 1 · pending 9  [70%]" in text
    assert "shards: 1 DONE, 1 PENDING, 1 RUNNING" in text
    progress = store.job_progress("job")
    assert progress is not None and with_counts(job, store.shards("job")) == progress
    assert (progress.done, progress.failed) == (20, 1)


def test_status_json_shows_the_job_row_its_counts_and_its_shard_rows() -> None:
    """`sluice status JOB --json`, byte for byte, for a job with a budget that ran and merged."""
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        table = boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")
        store = JobStore(table, ttl_days=1, clock=lambda: 1000.0)
        state = failed_job(s3, store, shards=2, done={0: LINES, 1: LINES}, part_rows=4)
        store.record_plan(
            JOB, plan=PLAN_FIGURES, shards=[(0, LINES, LINES), (1, LINES, LINES)], mode="direct", budget_cap=NANO
        )
        store.reserve_budget(JOB, 500, NANO, 0, join=True)
        store.release_budget(JOB, -200, 250, leave=True)
        failed = ItemState(3, "c-3", "failed", attempts=2, error="retries_exhausted: HTTP 500")
        store.record_progress(JOB, 0, [failed], done=11, failed=1, finished=True, run=1)
        dep: Any = SimpleNamespace(store=store)
        job = store.job(JOB)
        assert job is not None
        assert status_json(dep, job) == RUNNING_JSON % {"status": "RUNNING", "summary": ""}

        merge_job(s3=s3, store=store, state=state, clock=lambda: 1000.0)
        job = store.job(JOB)
        assert job is not None
        assert status_json(dep, job) == RUNNING_JSON % {"status": "SUCCEEDED", "summary": MERGED_SUMMARY}


PLAN_FIGURES = plan_figures(
    24, invalid={"invalid_json": 0}, bytes=2048, shards=2, max_error_rate=0.05, plan_seconds=0.25
)
NANO = 1_000_000_000
MERGED_SUMMARY = """
    "summary": {
      "counts": {
        "lines": 24,
        "blank": 0,
        "requests": 24,
        "results": 24,
        "errors": 0
      },
      "outputs": {
        "results": "s3://failure-test/outbox/failed.results.jsonl",
        "errors": "s3://failure-test/outbox/failed.errors.jsonl",
        "summary": "s3://failure-test/outbox/failed.summary.json"
      },
      "wall_seconds": 1000,
      "budget": {
        "cap_usd": 1,
        "spent_usd": 2.5e-7,
        "unsent_lines": 0
      }
    },
    "finished_at": 1000,"""
RUNNING_JSON = """{
  "job": {
    "pk": "JOB#job-failed",
    "sk": "META",
    "job_id": "job-failed",
    "execution": "x",
    "bucket": "failure-test",
    "key": "inbox/failed.jsonl",
    "etag": "\\"70bc23a57a73ea3881ce92d4f8130d81\\"",
    "status": "%(status)s",
    "started_at": 0,
    "expires_at": 87400,
    "plan": {
      "lines": 24,
      "requests": 24,
      "invalid": {
        "invalid_json": 0
      },
      "blank": 0,
      "bytes": 2048,
      "shards": 2,
      "mode": "direct",
      "concurrency": 4,
      "max_error_rate": 0.05,
      "cache": {
        "mode": "off",
        "hits": 0
      },
      "plan_seconds": 0.25
    },
    "shards": 2,
    "requests": 24,
    "budget_cap": 1000000000,
    "budget_committed": 300,
    "budget_spent": 250,
    "budget_holders": 0,%(summary)s
    "done": 11,
    "failed": 1
  },
  "shards": [
    {
      "shard": 0,
      "lines": 12,
      "requests": 12,
      "mode": "direct",
      "status": "DONE",
      "done": 11,
      "failed": 1,
      "runs": 1,
      "expires_at": 87400,
      "waiting": 0
    },
    {
      "shard": 1,
      "lines": 12,
      "requests": 12,
      "mode": "direct",
      "status": "PENDING",
      "done": 0,
      "failed": 0,
      "runs": 0,
      "expires_at": 87400,
      "waiting": 0
    }
  ]
}"""
