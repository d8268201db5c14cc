"""The job and item rows read back from a moto table as the contract's types: exactly what the
store wrote, and an error for an attribute it never writes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest
from boto3.dynamodb.conditions import Attr
from botocore.exceptions import ClientError
from moto import mock_aws
from sluice.contract import (
    CollectedBatch,
    ItemRow,
    JobProgress,
    JobRow,
    PlanCache,
    StateError,
    Summary,
    SummaryRow,
)
from sluice.store.jobs import ItemState, JobStore
from sluice.store.keys import item_key, job_key, shard_key
from sluice.store.rows import conditional, plain

from sluice_local.cloud import create_table
from tests.conftest import plan_figures

NOW = 1000.0
EXPIRES = int(NOW) + 86400


@pytest.fixture
def table() -> Iterator[Any]:
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        yield boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")


@pytest.fixture
def store(table: Any) -> JobStore:
    return JobStore(table, ttl_days=1, clock=lambda: NOW)


def stray(table: Any, key: dict[str, str], *path: str) -> None:
    """An attribute at `path` (`stray` at the row's top by default) that the store never writes."""
    names = {f"#a{n}": name for n, name in enumerate(path or ("stray",))}
    table.update_item(
        Key=key,
        UpdateExpression=f"SET {'.'.join(names)} = :v",
        ExpressionAttributeNames=names,
        ExpressionAttributeValues={":v": 1},
    )


def test_a_job_row_reads_as_every_write_of_the_store_left_it(store: JobStore, table: Any) -> None:
    store.claim_job("job", execution="exec-1", bucket="b", key="inbox/job.jsonl", etag='"t"', started_at=12.5)
    claimed = JobRow(
        job_id="job",
        execution="exec-1",
        bucket="b",
        key="inbox/job.jsonl",
        etag='"t"',
        status="PLANNING",
        started_at=12.5,
        expires_at=EXPIRES,
    )
    assert store.job("job") == claimed

    plan = plan_figures(20, invalid={"invalid_json": 1}, cache=PlanCache(mode="read", hits=3), plan_seconds=0.5)
    store.record_plan("job", plan=plan, shards=[(0, 10, 10), (1, 10, 10)], mode="direct", budget_cap=1000)
    store.reserve_budget("job", 400, 1000, 7, join=True)
    store.finish_job(Summary(job_id="job", status="FAILED", input="s3://b/inbox/job.jsonl", error="it broke"))

    job = store.job("job")
    assert job == replace(
        claimed,
        status="FAILED",
        plan=plan,
        shards=2,
        requests=20,
        budget_cap=1000,
        budget_committed=400,
        budget_spent=7,
        budget_holders=1,
        summary=SummaryRow(error="it broke"),
        finished_at=NOW,
    )
    # `sluice status --json`: every attribute the row holds, as it holds it, and nothing else
    item = plain(table.get_item(Key=job_key("job"))["Item"])
    assert job.as_dict() == {k: v for k, v in item.items() if k not in job_key("job")}


def test_a_job_row_with_an_attribute_the_store_never_writes_is_refused(store: JobStore, table: Any) -> None:
    store.claim_job("job", execution="e", bucket="b", key="k", etag="t", started_at=0.0)
    store.record_plan("job", plan=plan_figures(1), shards=[(0, 1, 1)], mode="direct")
    stray(table, job_key("job"))
    with pytest.raises(StateError, match=r"job row: unknown key.*stray"):
        store.job("job")
    with pytest.raises(StateError, match="stray"):
        store.job_progress("job")


def test_a_job_row_whose_plan_has_a_figure_plan_never_writes_is_refused(store: JobStore, table: Any) -> None:
    store.claim_job("job", execution="e", bucket="b", key="k", etag="t", started_at=0.0)
    store.record_plan("job", plan=plan_figures(1), shards=[(0, 1, 1)], mode="direct")
    stray(table, job_key("job"), "plan", "stray")
    with pytest.raises(StateError, match=r"the job's plan: unknown key.*stray"):
        store.job("job")


def test_job_progress_is_the_row_and_its_shard_rows_counts(store: JobStore) -> None:
    store.claim_job("job", execution="e", bucket="b", key="k", etag="t", started_at=0.0)
    store.record_plan("job", plan=plan_figures(20), shards=[(0, 10, 10), (1, 10, 10)], mode="direct")
    store.record_progress("job", 0, [], done=6, failed=1, finished=False, run=1)
    store.record_progress("job", 1, [], done=10, failed=0, finished=True, run=1)
    job = store.job("job")
    assert job is not None

    progress = store.job_progress("job")

    assert progress == JobProgress(job, done=16, failed=1)
    assert progress.as_dict() == {**job.as_dict(), "done": 16, "failed": 1}
    assert store.job_progress("nope") is None


def test_an_item_row_reads_as_the_checkpoint_and_the_webhook_left_it(store: JobStore, table: Any) -> None:
    store.record_plan("job", plan=plan_figures(10), shards=[(0, 10, 10)], mode="background")
    failed = ItemState(4, "c-4", "failed", attempts=6, error="retries_exhausted: HTTP 500")
    out = ItemState(5, "c-5", "submitted", "resp_5", attempts=1, swept=True)
    store.record_progress("job", 0, [failed, out], done=0, failed=1, finished=False, run=2, waiting=1)

    assert store.item("job", 0, 4) == ItemRow(
        shard=0,
        line=4,
        custom_id="c-4",
        status="failed",
        attempts=6,
        expires_at=EXPIRES,
        error="retries_exhausted: HTTP 500",
    )
    assert store.item_by_custom_id("job", "c-5") == ItemRow(
        shard=0,
        line=5,
        custom_id="c-5",
        status="submitted",
        attempts=1,
        expires_at=EXPIRES,
        provider_id="resp_5",
        swept=True,
    )
    assert list(store.items("job", 0)) == [failed, out]
    # a webhook settles the line: its row says so
    store.settle_item("resp_5")
    settled = store.item("job", 0, 5)
    assert settled is not None and settled.status == "settled"
    assert store.item("job", 0, 6) is None


def test_an_item_row_with_an_attribute_the_store_never_writes_is_refused(store: JobStore, table: Any) -> None:
    store.record_progress(
        "job", 0, [ItemState(4, "c-4", "failed", attempts=6)], done=0, failed=1, finished=False, run=1
    )
    stray(table, item_key("job", 0, 4))
    with pytest.raises(StateError, match=r"item row: unknown key.*stray"):
        store.item("job", 0, 4)
    with pytest.raises(StateError, match="stray"):
        list(store.items("job", 0))


def test_a_collected_batch_reads_back_from_its_shard_row_and_a_key_it_never_has_is_refused(
    store: JobStore, table: Any
) -> None:
    store.claim_job("job", execution="e", bucket="b", key="k", etag="t", started_at=0.0)
    store.record_plan("job", plan=plan_figures(10), shards=[(0, 10, 10)], mode="batch")
    store.set_shard_batches("job", 0, ["batch_a", "batch_b"])
    ended = CollectedBatch(status="completed", requests=6, results=5, errors=1, unfinished=0, left=0, turnaround_s=60.0)
    # a batch the provider gave no end: the row holds no turnaround
    endless = CollectedBatch(status="expired", requests=4, results=0, errors=0, unfinished=4, left=4)
    store.mark_batch_collected("job", 0, "batch_a", ended.as_dict())
    store.mark_batch_collected("job", 0, "batch_b", endless.as_dict())

    row = store.shard("job", 0)
    assert row is not None and row.batch_states is not None
    assert {k: CollectedBatch.from_dict(v) for k, v in row.batch_states.items()} == {
        "batch_a": ended,
        "batch_b": endless,
    }
    stray(table, shard_key("job", 0), "batch_states", "batch_a", "stray")
    row = store.shard("job", 0)
    assert row is not None and row.batch_states is not None
    with pytest.raises(StateError, match=r"a collected batch: unknown key.*stray"):
        CollectedBatch.from_dict(row.batch_states["batch_a"])


def test_a_conditional_write_that_loses_its_race_answers_none_and_any_other_error_is_raised() -> None:
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        table = boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")
        item = {"pk": "A", "sk": "B", "n": 1}
        first = conditional(table.put_item, Item=item, ConditionExpression=Attr("pk").not_exists())
        again = conditional(table.put_item, Item=item, ConditionExpression=Attr("pk").not_exists())
        assert first is not None and again is None
        with pytest.raises(ClientError, match="ValidationException"):
            conditional(table.update_item, Key={"pk": "A", "sk": "B"}, UpdateExpression="SET n = :missing")
