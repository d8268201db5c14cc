"""Job state in one DynamoDB table: the job row, a row per shard and a row per item.

The keys (`sluice.store.keys`): the job row alone under `JOB#<job>` / `META`; each shard's row
(`SHARD`) and its item rows (`ITEM#<line>`) under `JOB#<job>#<shard>`. A checkpoint writes its
shard's partition only, so no key takes writes that grow with the number of shards in flight;
the job's counts are the sum of its shard rows', read with BatchGetItem. What every shard still
writes to the job row is the budget's (`sluice.limits.budget`): a write per chunk of requests, whose
rate follows the job's request rate, not its shard count.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError

from sluice.contract import (
    ITEM_RESPONSE_ATTRIBUTE,
    PARTITION_KEY,
    SORT_KEY,
    ItemRow,
    JobProgress,
    JobRow,
    JobStatus,
    PlanFigures,
    ShardRow,
    ShardStatus,
    Summary,
    causes,
)
from sluice.store.batch_rows import BatchRows
from sluice.store.input_rows import InputRows
from sluice.store.keys import (
    DONE_PREFIX,
    ITEM_PREFIX,
    done_key,
    item_key,
    job_key,
    response_key,
    shard_key,
    shard_partition,
)
from sluice.store.rows import SHARD_WORKERS, BudgetState, ItemState, conditional, dynamo, each_shard, plain
from sluice.store.webhook_rows import WebhookRows

__all__ = ["QUEUED_PREFIX", "BudgetState", "ItemState", "JobCounts", "JobStore"]

# a batch shard's webhook index while none of its batches runs (its files wait for room in the
# provider's queue): no webhook names it, and it is no batch to cancel
QUEUED_PREFIX = "QUEUED#"
# the attribute of a shard row that tells a running shard to stop: the job's status (`CANCELLED`,
# `FAILED`); each shard reads it from its own row (`shard.Stopper`)
STOP_ATTRIBUTE = "stop"
# the attribute of a checkpoint's answered lines (`record_progress`): their numbers, comma-separated
DONE_LINES = "lines"
# shard rows Plan writes a second: a job of 2,000 shards takes 20 s, and four jobs planned at once
# write 400 units a second beside their lines', a tenth of a new on-demand table's warm 4,000
PLAN_ROWS_PER_S = 100


@dataclass(frozen=True)
class JobCounts:
    """Lines the job's shards have checkpointed, summed over their rows."""

    done: int = 0
    failed: int = 0


def _item(row: ItemRow) -> ItemState:
    return ItemState(
        line=row.line,
        custom_id=row.custom_id,
        status=row.status,
        provider_id=row.provider_id,
        attempts=row.attempts,
        error=row.error,
        swept=row.swept,
    )


class JobStore(WebhookRows, BatchRows, InputRows):
    """All reads and writes of job state. `table` is a boto3 DynamoDB Table resource."""

    def claim_job(self, job_id: str, *, execution: str, bucket: str, key: str, etag: str, started_at: float) -> bool:
        """Create the job row for this execution; False if another execution already owns the job.

        The same execution may claim again: a retried Plan must not mistake itself for a duplicate;
        so may any, once the job was refused because its key's job was running (`refuse_job`).
        """
        return (
            conditional(
                self._table.put_item,
                Item=dynamo(
                    {
                        **job_key(job_id),
                        "job_id": job_id,
                        "execution": execution,
                        "bucket": bucket,
                        "key": key,
                        "etag": etag,
                        "status": JobStatus.PLANNING,
                        "started_at": started_at,
                        "expires_at": self._expires(),
                    }
                ),
                ConditionExpression=(
                    Attr(PARTITION_KEY).not_exists() | Attr("execution").eq(execution) | Attr("refused_by").exists()
                ),
            )
            is not None
        )

    def record_plan(
        self,
        job_id: str,
        *,
        plan: PlanFigures,
        shards: list[tuple[int, int, int]],
        mode: str,
        shard_modes: Mapping[int, str] | None = None,
        budget_cap: int = 0,
        cached: Mapping[int, int] | None = None,
        answered: Collection[int] = (),
    ) -> None:
        """`shard_modes` overrides `mode` per shard (auto mode picks a mode for each); a
        `budget_cap` (nano-USD) starts the job's spend figures (`sluice.limits.budget`); `cached`
        counts the lines per shard that Plan answered from the response cache, done already, and
        `answered` the shards it answered whole, which never run."""
        modes = shard_modes or {}
        done = cached or {}
        for start in range(0, len(shards), PLAN_ROWS_PER_S):
            if start:
                # paced: several jobs' Plans at once stay within a new table's warm throughput
                self._sleep(1.0)
            self._put_shard_rows(job_id, shards[start : start + PLAN_ROWS_PER_S], mode, modes, done, answered)
        budget = ", budget_cap = :cap, budget_committed = :z, budget_spent = :z" if budget_cap else ""
        values = {":s": JobStatus.RUNNING, ":p": plan.to_json(), ":n": len(shards), ":r": plan.requests}
        self._table.update_item(
            Key=job_key(job_id),
            UpdateExpression="SET #s = :s, #p = :p, shards = :n, requests = :r" + budget,
            ExpressionAttributeNames={"#s": "status", "#p": "plan"},
            ExpressionAttributeValues=dynamo({**values, ":cap": budget_cap, ":z": 0} if budget_cap else values),
        )

    def _put_shard_rows(
        self,
        job_id: str,
        shards: list[tuple[int, int, int]],
        mode: str,
        modes: Mapping[int, str],
        done: Mapping[int, int],
        answered: Collection[int],
    ) -> None:
        with (
            causes.because(causes.PLAN_SHARD, count=len(shards)),
            self._table.batch_writer(overwrite_by_pkeys=[PARTITION_KEY, SORT_KEY]) as batch,
        ):
            for index, lines, requests in shards:
                batch.put_item(
                    Item={
                        **shard_key(job_id, index),
                        "shard": index,
                        "lines": lines,
                        "requests": requests,
                        "mode": modes.get(index, mode),
                        "status": ShardStatus.DONE if index in answered else ShardStatus.PENDING,
                        "done": done.get(index, 0),
                        "failed": 0,
                        "runs": 0,
                        "expires_at": self._expires(),
                    }
                )

    @causes.under(causes.BUDGET_CHUNK, causes.BUDGET_PART)
    def reserve_budget(self, job_id: str, amount: int, cap: int, spent: int, *, join: bool) -> BudgetState | None:
        """Add `amount` (nano-USD) to the job's committed spend if that keeps it within `cap`,
        with `spent` (what answers cost since the last write) added to its spend; count the shard
        among the holders of a pool when it `join`s. The figures as the write left them; None if
        the cap refuses."""
        if amount > cap:
            return None
        answer = conditional(
            self._table.update_item,
            Key=job_key(job_id),
            UpdateExpression="ADD budget_committed :a, budget_spent :s, budget_holders :h",
            ConditionExpression=Attr("budget_committed").lte(cap - amount),
            ExpressionAttributeValues={":a": amount, ":s": spent, ":h": 1 if join else 0},
            # ALL_NEW: UPDATED_NEW may leave out a figure the ADD did not change
            ReturnValues="ALL_NEW",
        )
        return None if answer is None else _budget_state(answer.get("Attributes", {}))

    @causes.under(causes.BUDGET_WAIT)
    def budget_state(self, job_id: str) -> BudgetState:
        """The job's committed spend (nano-USD) and how many shards hold a pool of it; strongly
        consistent, so no refund that reached the table is missed."""
        row = self._table.get_item(
            Key=job_key(job_id),
            ProjectionExpression="budget_committed, budget_holders",
            ConsistentRead=True,
        ).get("Item", {})
        return _budget_state(row)

    @causes.under(causes.RUN, causes.BATCH_SUBMIT, causes.BUDGET_WAIT)
    def release_budget(self, job_id: str, amount: int, spent: int, *, leave: bool) -> BudgetState:
        """Give back (negative `amount`) or add to the committed spend, record `spent`, and stop
        counting the shard among the holders when it `leave`s; unconditional. Returns the figures
        as the write left them."""
        row = self._table.update_item(
            Key=job_key(job_id),
            UpdateExpression="ADD budget_committed :a, budget_spent :s, budget_holders :h",
            ExpressionAttributeValues={":a": amount, ":s": spent, ":h": -1 if leave else 0},
            # ALL_NEW: UPDATED_NEW may leave out a figure the ADD did not change
            ReturnValues="ALL_NEW",
        ).get("Attributes", {})
        return _budget_state(row)

    def record_progress(
        self,
        job_id: str,
        shard: int,
        items: Iterable[ItemState],
        *,
        done: int,
        failed: int,
        finished: bool,
        run: int,
        waiting: int = 0,
    ) -> None:
        """Checkpoint a shard run: item rows in batches, then one update of the shard's row, all
        on the shard's own partition (the response pointers are keyed by response id)."""
        expires = self._expires()
        items = list(items)
        with (
            causes.because(causes.LINE, count=len(items)),
            self._table.batch_writer(overwrite_by_pkeys=[PARTITION_KEY, SORT_KEY]) as batch,
        ):
            for item in items:
                batch.put_item(
                    Item=dynamo(
                        {
                            **item_key(job_id, shard, item.line),
                            "shard": shard,
                            "line": item.line,
                            "custom_id": item.custom_id,
                            "status": item.status,
                            "attempts": item.attempts,
                            ITEM_RESPONSE_ATTRIBUTE: item.provider_id,
                            "error": item.error,
                            "swept": True if item.swept else None,
                            "expires_at": expires,
                        }
                    )
                )
                if item.status == "submitted" and item.provider_id:
                    # keyed by the response id, so a webhook finds its item with one strongly
                    # consistent read instead of an eventually consistent index query
                    batch.put_item(
                        Item={
                            **response_key(item.provider_id),
                            "job_id": job_id,
                            "shard": shard,
                            "line": item.line,
                            "expires_at": expires,
                        }
                    )
        self._table.update_item(
            Key=shard_key(job_id, shard),
            UpdateExpression="SET #s = :s, runs = :run ADD done :d, failed :f, waiting :w",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={
                ":s": ShardStatus.DONE if finished else ShardStatus.RUNNING,
                ":run": run,
                ":d": done,
                ":f": failed,
                ":w": waiting,
            },
        )

    def record_answered(self, job_id: str, shard: int, run: int, lines: Collection[int]) -> None:
        """A part's lines that ended with an answer, one item for them all: a row each was a write a
        line (a background line's row, already there from its submit, reads as done in `items`)."""
        answered = sorted(lines)
        # through the checkpoint's own BatchWriteItem, the write its steps are granted
        with self._table.batch_writer(overwrite_by_pkeys=[PARTITION_KEY, SORT_KEY]) as batch:
            batch.put_item(
                Item={
                    **done_key(job_id, shard, run, answered[0]),
                    DONE_LINES: ",".join(map(str, answered)),
                    "expires_at": self._expires(),
                }
            )

    @causes.under(causes.RUN, causes.POLL, causes.CANCEL)
    def _query(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        while True:
            page = self._table.query(**kwargs)
            yield from page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _answered(self, job_id: str, shard: int) -> set[int]:
        """The shard's lines its checkpoints recorded as answered (`record_progress`), strongly consistent."""
        condition = Key(PARTITION_KEY).eq(shard_partition(job_id, shard)) & Key(SORT_KEY).begins_with(DONE_PREFIX)
        found: set[int] = set()
        for row in self._query(KeyConditionExpression=condition, ConsistentRead=True):
            found.update(int(line) for line in str(row[DONE_LINES]).split(","))
        return found

    def items(self, job_id: str, shard: int) -> Iterator[ItemState]:
        """The item rows of one shard, in line order, a row whose line was answered since as done:
        its partition, strongly consistent."""
        answered = self._answered(job_id, shard)
        condition = Key(PARTITION_KEY).eq(shard_partition(job_id, shard)) & Key(SORT_KEY).begins_with(ITEM_PREFIX)
        for row in self._query(KeyConditionExpression=condition, ConsistentRead=True):
            item = _item(ItemRow.from_item(plain(row)))
            if item.line in answered:
                item.status = "done"
            yield item

    @causes.under(causes.USER)
    def item(self, job_id: str, shard: int, line: int) -> ItemRow | None:
        row = self._table.get_item(Key=item_key(job_id, shard, line)).get("Item")
        return ItemRow.from_item(plain(row)) if row else None

    def item_by_custom_id(self, job_id: str, custom_id: str) -> ItemRow | None:
        """The item row of one request, if it has one (failures, background and batch requests do).

        The shards' partitions, a few at a time in shard order, filtered: it reads only this job's
        item rows, never the table, and stops at the first few shards that hold the request.
        """
        count = self._shard_count(job_id)

        def lookup(shard: int) -> ItemRow | None:
            condition = Key(PARTITION_KEY).eq(shard_partition(job_id, shard)) & Key(SORT_KEY).begins_with(ITEM_PREFIX)
            found = next(
                self._query(KeyConditionExpression=condition, FilterExpression=Attr("custom_id").eq(custom_id)), None
            )
            return ItemRow.from_item(plain(found)) if found else None

        for start in range(0, count, SHARD_WORKERS):
            for row in each_shard(lookup, range(start, min(count, start + SHARD_WORKERS))):
                if row is not None:
                    return row
        return None

    @causes.under(causes.MERGE, causes.MARK_FAILED, causes.USER)
    def job(self, job_id: str) -> JobRow | None:
        """The job row alone: its status, plan, budget figures and summary, but no line counts
        (`counts`, `job_progress`)."""
        row = self._table.get_item(Key=job_key(job_id)).get("Item")
        return JobRow.from_item(plain(row)) if row else None

    @causes.under(causes.SHARD_FAILED, causes.MARK_FAILED, causes.USER)
    def _shard_count(self, job_id: str) -> int:
        row = (
            self._table.get_item(
                Key=job_key(job_id), ProjectionExpression="#n", ExpressionAttributeNames={"#n": "shards"}
            ).get("Item")
            or {}
        )
        return int(row.get("shards", 0))

    @causes.under(causes.MERGE, causes.SHARD_FAILED, causes.MARK_FAILED, causes.CANCEL, causes.USER)
    def shards(self, job_id: str, *, count: int | None = None, consistent: bool = False) -> list[ShardRow]:
        """Every shard row of the job, in shard order; `count` is the job row's `shards`, read
        when not given. Eventually consistent unless asked (a cancel looking for open batches)."""
        count = self._shard_count(job_id) if count is None else count
        # a row a shard, read for its open work: what a cancel or MarkFailed costs grows with the shards
        with causes.because(causes.SHARD_OUTPUTS, count=count):
            rows = self._batch_get([shard_key(job_id, shard) for shard in range(count)], consistent=consistent)
        return sorted((ShardRow.from_item(plain(row)) for row in rows), key=lambda row: row.shard)

    @causes.under(causes.USER)
    def counts(self, job_id: str, shards: int) -> JobCounts:
        """The job's lines done and failed: its `shards` rows summed, eventually consistent (a
        progress figure a moment old, a second read away from the last checkpoints)."""
        keys = [shard_key(job_id, shard) for shard in range(shards)]
        rows = self._batch_get(keys, projection="#d, #f", names={"#d": "done", "#f": "failed"})
        return JobCounts(sum(int(r.get("done", 0)) for r in rows), sum(int(r.get("failed", 0)) for r in rows))

    def job_progress(self, job_id: str) -> JobProgress | None:
        """The job row with `done` and `failed` summed from its shard rows, for status and progress."""
        job = self.job(job_id)
        if job is None:
            return None
        counts = self.counts(job_id, job.shards or 0)
        return JobProgress(job, done=counts.done, failed=counts.failed)

    def finish_job(self, summary: Summary) -> None:
        """The job's final status, and what its row keeps of its summary (`Summary.row`)."""
        self._table.update_item(
            Key=job_key(summary.job_id),
            UpdateExpression="SET #s = :s, summary = :summary, finished_at = :t",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues=dynamo(
                {":s": summary.status, ":summary": summary.row().to_json(), ":t": self._clock()}
            ),
        )

    def refuse_job(self, summary: Summary, running: str) -> None:
        """The job ended without running, refused while `running` owns its key: like `finish_job`,
        and the same object's next event runs it again (`claim_job`), once that job has ended."""
        self._table.update_item(
            Key=job_key(summary.job_id),
            UpdateExpression="SET #s = :s, summary = :summary, finished_at = :t, refused_by = :running",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues=dynamo(
                {":s": summary.status, ":summary": summary.row().to_json(), ":t": self._clock(), ":running": running}
            ),
        )

    def shard(self, job_id: str, shard: int) -> ShardRow | None:
        """The shard's row, strongly consistent; None before Plan wrote it."""
        row = self._shard_row(shard_key(job_id, shard))
        return ShardRow.from_item(plain(row)) if row else None

    def stop_shards(self, job_id: str | None, reason: str, *, shards: int | None = None) -> int:
        """Tell every running shard of the job to stop sending: `reason` (the job's status,
        CANCELLED or FAILED) on each shard row, which the shard reads from its own row
        (`stop_mark`). `shards` is the job row's count, read when not given; no job (Plan failed
        before there was one) has nothing running. A row that could not be marked is left as it
        is: its shard stops when its run does. Returns how many rows were marked."""
        if job_id is None:
            return 0
        count = self._shard_count(job_id) if shards is None else shards

        def mark(shard: int) -> bool:
            try:
                with causes.because(causes.SHARD_OUTPUTS):
                    self._table.update_item(
                        Key=shard_key(job_id, shard),
                        UpdateExpression="SET #stop = :reason",
                        ConditionExpression=Attr(PARTITION_KEY).exists(),
                        ExpressionAttributeNames={"#stop": STOP_ATTRIBUTE},
                        ExpressionAttributeValues={":reason": reason},
                    )
            except ClientError:
                return False
            return True

        return sum(each_shard(mark, range(count)))

    def stop_mark(self, job_id: str, shard: int) -> str | None:
        """Why the shard must stop (`stop_shards`), or None: one strongly consistent read of its own row."""
        row = (
            self._table.get_item(
                Key=shard_key(job_id, shard),
                ProjectionExpression="#stop",
                ExpressionAttributeNames={"#stop": STOP_ATTRIBUTE},
                ConsistentRead=True,
            ).get("Item")
            or {}
        )
        return str(row[STOP_ATTRIBUTE]) if row.get(STOP_ATTRIBUTE) else None


def _budget_state(row: Mapping[str, Any]) -> BudgetState:
    return BudgetState(int(row.get("budget_committed", 0)), int(row.get("budget_holders", 0)))
