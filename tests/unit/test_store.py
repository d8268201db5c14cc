"""JobStore against a moto DynamoDB table: the key layout at scale, and the reads `sluice status` relies on."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from sluice.contract import PROVIDER_ID_INDEX, StateError
from sluice.store.jobs import PLAN_ROWS_PER_S, ItemState, JobStore
from sluice.store.keys import item_key, job_key, shard_key

from sluice_local.cloud import create_table
from tests.conftest import plan_figures


class PartitionLedger:
    """Every DynamoDB call a client sends, counted by the partition key it writes or reads, from
    the request as it goes on the wire (whatever store method or boto3 layer made it)."""

    def __init__(self, client: Any) -> None:
        self.writes: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self._events = client.meta.events

    def __enter__(self) -> PartitionLedger:
        self._events.register("before-call.dynamodb", self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        self._events.unregister("before-call.dynamodb", self._record)

    def _record(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        body = json.loads(params["body"] or b"{}")
        operation = model.name
        if operation == "PutItem":
            self.writes[body["Item"]["pk"]["S"]] += 1
        elif operation in ("UpdateItem", "DeleteItem"):
            self.writes[body["Key"]["pk"]["S"]] += 1
        elif operation == "BatchWriteItem":
            for requests in body["RequestItems"].values():
                for request in requests:
                    row = request.get("PutRequest", {}).get("Item") or request["DeleteRequest"]["Key"]
                    self.writes[row["pk"]["S"]] += 1
        elif operation == "GetItem":
            self.reads[body["Key"]["pk"]["S"]] += 1
        elif operation == "BatchGetItem":
            for ask in body["RequestItems"].values():
                for key in ask["Keys"]:
                    self.reads[key["pk"]["S"]] += 1
        elif operation == "Query" and "IndexName" not in body:
            name = next(n for n, attribute in body["ExpressionAttributeNames"].items() if attribute == "pk")
            value = re.search(rf"{name} = (:\w+)", body["KeyConditionExpression"])
            assert value is not None
            self.reads[body["ExpressionAttributeValues"][value.group(1)]["S"]] += 1


@pytest.fixture
def moto_table() -> Iterator[Any]:
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        yield boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")


def run_checkpoints(table: Any, job_id: str, shards: int, *, checkpoints: int = 3) -> PartitionLedger:
    """A background job of `shards` shards, each checkpointing `checkpoints` times (a line done, a
    line failed with its item row, a response submitted with its own), as shards in flight do."""
    store = JobStore(table, ttl_days=1)
    with PartitionLedger(table.meta.client) as ledger:
        store.claim_job(job_id, execution="e", bucket="b", key="k", etag="t", started_at=0.0)
        store.record_plan(
            job_id, plan=plan_figures(shards * 10), shards=[(s, 10, 10) for s in range(shards)], mode="background"
        )
        for run in range(1, checkpoints + 1):
            for shard in range(shards):
                line = shard * 10 + run
                items = [
                    ItemState(line, f"c-{line}", "failed", attempts=6, error="retries_exhausted: HTTP 500"),
                    ItemState(line + 5, f"c-{line + 5}", "submitted", f"resp_{job_id}_{line}"),
                ]
                store.record_progress(
                    job_id, shard, items, done=1, failed=1, finished=run == checkpoints, run=run, waiting=1
                )
    return ledger


def test_no_partition_takes_more_checkpoint_writes_as_the_shards_in_flight_grow(moto_table: Any) -> None:
    few = run_checkpoints(moto_table, "few", 4)
    many = run_checkpoints(moto_table, "many", 40)

    assert max(many.writes.values()) == max(few.writes.values())
    # the job row: the claim and the plan, whatever the number of shards
    assert many.writes["JOB#many"] == few.writes["JOB#few"] == 2


def test_the_job_counts_are_its_shard_rows_summed_and_no_checkpoint_writes_the_job_row(moto_table: Any) -> None:
    run_checkpoints(moto_table, "job", 3)
    store = JobStore(moto_table, ttl_days=1)

    row = moto_table.get_item(Key=job_key("job"))["Item"]
    assert "done" not in row and "failed" not in row
    progress = store.job_progress("job")
    assert progress is not None and (progress.done, progress.failed, progress.job.status) == (9, 9, "RUNNING")
    assert store.counts("job", 3).done == 9
    assert [s.shard for s in store.shards("job")] == [0, 1, 2]
    assert store.job_progress("nope") is None


def test_stop_marks_reach_every_shard_row_and_each_shard_reads_only_its_own(moto_table: Any) -> None:
    store = JobStore(moto_table, ttl_days=1)
    store.claim_job("job", execution="e", bucket="b", key="k", etag="t", started_at=0.0)
    store.record_plan("job", plan=plan_figures(300), shards=[(s, 10, 10) for s in range(30)], mode="direct")
    with PartitionLedger(moto_table.meta.client) as ledger:
        assert [store.stop_mark("job", s) for s in range(30)] == [None] * 30
        assert store.stop_shards("job", "FAILED") == 30
        assert {store.stop_mark("job", s) for s in range(30)} == {"FAILED"}
    # each shard row: its mark and two reads of its own; the job row: one read for the shard count
    assert ledger.reads["JOB#job"] == 1
    assert {pk: n for pk, n in ledger.reads.items() if pk != "JOB#job"} == {f"JOB#job#{s:05d}": 2 for s in range(30)}
    assert set(ledger.writes.values()) == {1} and len(ledger.writes) == 30
    # rows that do not exist are not created, and no job has nothing to stop
    assert store.stop_shards("job", "FAILED", shards=32) == 30
    assert store.shard("job", 31) is None
    assert store.stop_shards(None, "FAILED") == 0


def test_a_shard_row_reads_as_its_attributes_and_refuses_one_the_store_never_writes(moto_table: Any) -> None:
    store = JobStore(moto_table, ttl_days=1)
    store.claim_job("job", execution="e", bucket="b", key="k", etag="t", started_at=0.0)
    store.record_plan("job", plan=plan_figures(20), shards=[(0, 10, 10), (1, 10, 10)], mode="batch")
    store.set_shard_batches("job", 1, ["batch_1", ""])
    row = store.shard("job", 1)
    assert row is not None and (row.shard, row.lines, row.mode, row.status) == (1, 10, "batch", "PENDING")
    assert row.batch_ids == ("batch_1", "") and row.provider_id == "batch_1" and row.batch_settled is None
    # what `sluice status --json` shows: the attributes the row holds, none invented
    assert "batch_ids" not in store.shards("job")[0].as_dict()
    assert row.as_dict()["batch_ids"] == ["batch_1", ""]
    moto_table.update_item(
        Key=shard_key("job", 0), UpdateExpression="SET stray = :v", ExpressionAttributeValues={":v": 1}
    )
    with pytest.raises(StateError, match="stray"):
        store.shard("job", 0)


@pytest.fixture
def table(moto_table: Any) -> Any:
    store = JobStore(moto_table, ttl_days=1)
    store.record_plan("job", plan=plan_figures(6), shards=[(0, 3, 3), (1, 3, 3)], mode="background")
    failed = ItemState(5, "b", "failed", attempts=6, error="retries_exhausted: HTTP 500")
    store.record_progress(
        "job",
        0,
        [ItemState(1, "a", "submitted", "resp_a"), ItemState(2, "x", "settled", "resp_x")],
        done=0,
        failed=0,
        finished=False,
        run=1,
        waiting=1,
    )
    store.record_progress(
        "job", 1, [ItemState(4, "y", "submitted", "resp_y"), failed], done=0, failed=1, finished=False, run=1
    )
    store.record_plan("other", plan=plan_figures(1), shards=[(0, 1, 1)], mode="background")
    store.record_progress(
        "other", 0, [ItemState(1, "c", "submitted", "resp_c")], done=0, failed=0, finished=False, run=1
    )
    return moto_table


def test_a_request_is_found_by_its_custom_id_in_its_own_job_only(table: Any) -> None:
    store = JobStore(table, ttl_days=1)
    row = store.item_by_custom_id("job", "b")
    assert row is not None
    assert (row.line, row.shard, row.status, row.attempts) == (5, 1, "failed", 6)
    assert row.error == "retries_exhausted: HTTP 500"
    # numbers come back as JSON numbers, not DynamoDB's Decimal
    assert type(row.attempts) is int and type(row.shard) is int
    assert store.item_by_custom_id("job", "c") is None  # a request of another job
    assert store.item_by_custom_id("job", "nope") is None


class OneRowPages:
    """The table, answering each query a row at a time, as DynamoDB does past 1 MB a page."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.queried: list[str] = []

    def query(self, **kwargs: Any) -> Any:
        self.queried.append(
            kwargs["KeyConditionExpression"].get_expression()["values"][0].get_expression()["values"][1]
        )
        return self.table.query(Limit=1, **kwargs)

    def get_item(self, **kwargs: Any) -> Any:
        return self.table.get_item(**kwargs)


def test_the_lookup_follows_the_pages_of_each_shard_and_reads_only_the_job_s_own(table: Any) -> None:
    pages = OneRowPages(table)
    row = JobStore(pages, ttl_days=1).item_by_custom_id("job", "y")
    assert row is not None and row.line == 4
    # every page of both shards' partitions (the first has two rows), never another job's
    assert sorted(pages.queried) == ["JOB#job#00000"] * 3 + ["JOB#job#00001"] * 1


def test_a_line_the_sweep_submitted_keeps_its_mark_until_collected(moto_table: Any) -> None:
    store = JobStore(moto_table, ttl_days=1)
    items = [ItemState(7, "s", "submitted", "resp_s", 8, swept=True), ItemState(8, "t", "submitted", "resp_t", 1)]
    store.record_progress("swept", 2, items, done=0, failed=0, finished=False, run=1, waiting=2)
    marks = {item.line: item.swept for item in store.items("swept", 2)}
    assert marks == {7: True, 8: False}
    # an unswept row carries no attribute for it
    assert "swept" not in moto_table.get_item(Key=item_key("swept", 2, 8))["Item"]
    swept, unswept = store.item("swept", 2, 7), store.item("swept", 2, 8)
    assert swept is not None and swept.swept and unswept is not None and not unswept.swept
    assert list(store.items("swept", 1)) == []


class Throttled:
    """The table, but DynamoDB leaves every key of the first `times` BatchGetItem calls unprocessed."""

    def __init__(self, table: Any, times: int) -> None:
        self._table = table
        self.times = times
        self.name = table.name
        self.meta = self
        self.client = self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        if self.times:
            self.times -= 1
            return {"Responses": {}, "UnprocessedKeys": RequestItems}
        return dict(self._table.meta.client.batch_get_item(RequestItems=RequestItems))


def test_keys_left_unprocessed_are_asked_again_after_a_jittered_backoff(moto_table: Any) -> None:
    from sluice.core.retry import table_retry_delay_s

    run_checkpoints(moto_table, "job", 3)
    slept: list[float] = []
    store = JobStore(Throttled(moto_table, times=2), ttl_days=1, sleep=slept.append, rand=lambda: 1.0)
    assert store.counts("job", 3).done == 9
    assert slept == [table_retry_delay_s(1, lambda: 1.0), table_retry_delay_s(2, lambda: 1.0)]


def test_a_batch_webhook_finds_its_shard_through_an_index_of_keys_only() -> None:
    from sluice.contract import create_table_request

    with mock_aws():
        request = create_table_request("keys-only")
        for index in request["GlobalSecondaryIndexes"]:
            index["Projection"] = {"ProjectionType": "KEYS_ONLY"}
        boto3.client("dynamodb", region_name="us-east-1").create_table(**request)
        store = JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table("keys-only"), ttl_days=1)
        store.record_plan("job", plan=plan_figures(20), shards=[(0, 10, 10), (1, 10, 10)], mode="batch")
        store.set_shard_batches("job", 1, ["batch_1"])
        assert store.arm_shard("job", 1, "token-1") is False
        assert store.settle_batch("batch_1", "completed") == "token-1"
        settled = store.shard("job", 1)
        assert settled is not None and settled.batch_settled == "completed"
        # a repeat wakes again (the first wake may have failed); an unknown batch changes nothing
        assert store.settle_batch("batch_1", "completed") == "token-1"
        assert store.settle_batch("batch_other", "completed") is None


def test_a_background_line_keeps_its_response_id_off_the_index_and_its_webhook_still_finds_it(
    moto_table: Any,
) -> None:
    """A line's row is written at submit and at collect: on the provider-id index too it cost a
    second write each time. The webhook finds the line by its response's pointer row instead."""
    store = JobStore(moto_table, ttl_days=1)
    store.record_plan("job", plan=plan_figures(2), shards=[(0, 2, 2)], mode="background")
    store.record_progress(
        "job", 0, [ItemState(1, "a", "submitted", "resp_a")], done=0, failed=0, finished=False, run=1, waiting=1
    )
    indexed = moto_table.scan(IndexName=PROVIDER_ID_INDEX)["Items"]
    assert indexed == []
    assert [i.provider_id for i in store.items("job", 0)] == ["resp_a"]
    row = store.item("job", 0, 1)
    assert row is not None and row.provider_id == "resp_a"
    store.arm_shard("job", 0, "token")
    assert store.settle_item("resp_a") == "token"
    assert [i.status for i in store.items("job", 0)] == ["settled"]


def test_plan_writes_its_shard_rows_a_paced_second_at_a_time(moto_table: Any) -> None:
    slept: list[float] = []
    store = JobStore(moto_table, ttl_days=1, sleep=slept.append)
    shards = 2 * PLAN_ROWS_PER_S + 1
    with PartitionLedger(moto_table.meta.client) as ledger:
        store.record_plan("job", plan=plan_figures(shards), shards=[(s, 1, 1) for s in range(shards)], mode="direct")
    assert slept == [1.0, 1.0]
    assert len(store.shards("job")) == shards
    assert sum(n for pk, n in ledger.writes.items() if pk != "JOB#job") == shards


def test_a_parts_answered_lines_share_one_item_and_read_back_as_done(moto_table: Any) -> None:
    """A background line answered at collect was rewritten row by row, a write a line; now a
    part's answered lines are one item, and the rows still out read back as they stand."""
    store = JobStore(moto_table, ttl_days=1)
    store.record_plan("job", plan=plan_figures(300), shards=[(0, 300, 300)], mode="background")
    out = [ItemState(n, f"c{n}", "submitted", f"resp_{n}") for n in range(300)]
    store.record_progress("job", 0, out, done=0, failed=0, finished=False, run=1, waiting=300)
    failed = ItemState(1, "c1", "failed", "resp_1", attempts=3, error="server_error: boom")
    with PartitionLedger(moto_table.meta.client) as ledger:
        store.record_answered("job", 0, 2, range(0, 300, 2))
        store.record_progress("job", 0, [failed], done=150, failed=1, finished=False, run=2, waiting=-151)
    # one item for the 150 answers, the failed line's row, the shard's row
    assert ledger.writes == Counter({"JOB#job#00000": 3})
    statuses = {item.line: item.status for item in store.items("job", 0)}
    assert len(statuses) == 300
    assert {statuses[n] for n in range(0, 300, 2)} == {"done"}
    assert statuses[1] == "failed" and statuses[3] == "submitted"


def test_a_pass_through_the_shards_starts_no_more_than_its_pace_and_answers_in_shard_order() -> None:
    import threading
    import time

    from sluice.store.rows import each_shard

    starts: list[float] = []
    lock = threading.Lock()

    def call(shard: int) -> int:
        with lock:
            starts.append(time.monotonic())
        return shard * 10

    began = time.monotonic()
    assert each_shard(call, range(41), per_s=400) == [n * 10 for n in range(41)]
    # the 41st shard starts no sooner than 40 / 400 s after the first: the table sees 400 a second at most
    assert max(starts) - began >= 40 / 400
    assert each_shard(call, []) == []
