"""JobStore reads that `sluice status` relies on, against a moto DynamoDB table."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from sluice.store import ItemState, JobStore

from local.cloud import create_table


class OneRowPages:
    """The table, answering each query a row at a time, as DynamoDB does past 1 MB a page."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.queries = 0

    def query(self, **kwargs: Any) -> Any:
        self.queries += 1
        return self.table.query(Limit=1, **kwargs)


@pytest.fixture
def table() -> Iterator[Any]:
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        table = boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")
        store = JobStore(table, ttl_days=1)
        failed = ItemState(3, "b", "failed", attempts=6, error="retries_exhausted: HTTP 500")
        items = [ItemState(1, "a", "submitted", "resp_a"), ItemState(2, "x", "settled", "resp_x"), failed]
        store.record_progress("job", 0, items, done=0, failed=1, finished=False, run=1, waiting=1)
        store.record_progress(
            "other", 0, [ItemState(1, "c", "submitted", "resp_c")], done=0, failed=0, finished=False, run=1
        )
        yield table


def test_a_request_is_found_by_its_custom_id_in_its_own_job_only(table: Any) -> None:
    store = JobStore(table, ttl_days=1)
    row = store.item_by_custom_id("job", "b")
    assert row is not None
    assert (row["line"], row["status"], row["attempts"], row["error"]) == (
        3,
        "failed",
        6,
        "retries_exhausted: HTTP 500",
    )
    # numbers come back as JSON numbers, not DynamoDB's Decimal
    assert type(row["attempts"]) is int and type(row["shard"]) is int
    assert store.item_by_custom_id("job", "c") is None  # a request of another job
    assert store.item_by_custom_id("job", "nope") is None


def test_the_lookup_follows_the_pages_of_a_large_job(table: Any) -> None:
    pages = OneRowPages(table)
    row = JobStore(pages, ttl_days=1).item_by_custom_id("job", "b")
    assert row is not None and row["line"] == 3
    # the job's item rows one page each, up to the one that matched; the other job's rows are never read
    assert pages.queries == 3


def test_a_line_the_sweep_submitted_keeps_its_mark_until_collected(table: Any) -> None:
    store = JobStore(table, ttl_days=1)
    items = [ItemState(7, "s", "submitted", "resp_s", 8, swept=True), ItemState(8, "t", "submitted", "resp_t", 1)]
    store.record_progress("swept", 0, items, done=0, failed=0, finished=False, run=1, waiting=2)
    marks = {item.line: item.swept for item in store.items("swept", 1, 10)}
    assert marks == {7: True, 8: False}
    # an unswept row carries no attribute for it
    assert "swept" not in (store.item("swept", 8) or {})
