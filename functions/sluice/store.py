"""Job state in one DynamoDB table: the job row, a row per shard and a row per item."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Attr, Key
from botocore.exceptions import ClientError

from .contract import PROVIDER_ID_ATTRIBUTE, PROVIDER_ID_INDEX

ITEM_WIDTH = 9
# a batch shard's webhook index while none of its batches runs (its files wait for room in the
# provider's queue): no webhook names it, and it is no batch to cancel
QUEUED_PREFIX = "QUEUED#"


def job_pk(job_id: str) -> str:
    return f"JOB#{job_id}"


def shard_sk(index: int) -> str:
    return f"SHARD#{index:05d}"


def item_sk(line: int) -> str:
    return f"ITEM#{line:0{ITEM_WIDTH}d}"


def _plain(value: Any) -> Any:
    """DynamoDB hands numbers back as Decimal; the workflow wants JSON numbers."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _token(shard_row: dict[str, Any]) -> str | None:
    return str(shard_row["token"]) if shard_row.get("token") else None


def _token_if_nothing_waits(shard_row: dict[str, Any]) -> str | None:
    """The task token to wake a shard with, once none of its items is still out."""
    return _token(shard_row) if int(shard_row.get("waiting", 0)) <= 0 else None


def _dynamo(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(str(value))
    if isinstance(value, dict):
        return {k: _dynamo(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_dynamo(v) for v in value]
    return value


@dataclass
class ItemState:
    line: int
    custom_id: str
    status: str
    provider_id: str | None = None
    attempts: int = 0
    error: str | None = None
    # sent again by the last sweep (`sluice.sweep`): a background line keeps the mark until collected
    swept: bool = False


class JobStore:
    """All reads and writes of job state. `table` is a boto3 DynamoDB Table resource."""

    def __init__(self, table: Any, *, ttl_days: int, clock: Callable[[], float] = time.time) -> None:
        self._table = table
        self._ttl_s = ttl_days * 86400
        self._clock = clock

    @property
    def table(self) -> Any:
        """The table resource, for the items that are not job state (`shared_limit`'s buckets)."""
        return self._table

    def _expires(self) -> int:
        return int(self._clock()) + self._ttl_s

    def claim_job(self, job_id: str, *, execution: str, bucket: str, key: str, etag: str, started_at: float) -> bool:
        """Create the job row for this execution; False if another execution already owns the job.

        The same execution may claim again: a retried Plan must not mistake itself for a duplicate.
        """
        try:
            self._table.put_item(
                Item=_dynamo(
                    {
                        "pk": job_pk(job_id),
                        "sk": "META",
                        "job_id": job_id,
                        "execution": execution,
                        "bucket": bucket,
                        "key": key,
                        "etag": etag,
                        "status": "PLANNING",
                        "started_at": started_at,
                        "expires_at": self._expires(),
                    }
                ),
                ConditionExpression=Attr("pk").not_exists() | Attr("execution").eq(execution),
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def record_plan(
        self,
        job_id: str,
        *,
        plan: dict[str, Any],
        shards: list[tuple[int, int, int]],
        mode: str,
        shard_modes: Mapping[int, str] | None = None,
        budget_cap: int = 0,
        cached: Mapping[int, int] | None = None,
        answered: Collection[int] = (),
    ) -> None:
        """`shard_modes` overrides `mode` per shard (auto mode picks a mode for each); a
        `budget_cap` (nano-USD) starts the job's spend figures (`sluice.budget`); `cached`
        counts the lines per shard that Plan answered from the response cache, done already, and
        `answered` the shards it answered whole, which never run."""
        modes = shard_modes or {}
        done = cached or {}
        with self._table.batch_writer(overwrite_by_pkeys=["pk", "sk"]) as batch:
            for index, lines, requests in shards:
                batch.put_item(
                    Item={
                        "pk": job_pk(job_id),
                        "sk": shard_sk(index),
                        "shard": index,
                        "lines": lines,
                        "requests": requests,
                        "mode": modes.get(index, mode),
                        "status": "DONE" if index in answered else "PENDING",
                        "done": done.get(index, 0),
                        "failed": 0,
                        "runs": 0,
                        "expires_at": self._expires(),
                    }
                )
        budget = ", budget_cap = :cap, budget_committed = :z, budget_spent = :z" if budget_cap else ""
        values = {
            ":s": "RUNNING",
            ":p": plan,
            ":n": len(shards),
            ":r": plan["requests"],
            ":d": sum(done.values()),
            ":z": 0,
        }
        self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": "META"},
            UpdateExpression="SET #s = :s, #p = :p, shards = :n, requests = :r, done = :d, failed = :z" + budget,
            ExpressionAttributeNames={"#s": "status", "#p": "plan"},
            ExpressionAttributeValues=_dynamo({**values, ":cap": budget_cap} if budget_cap else values),
        )

    def reserve_budget(self, job_id: str, amount: int, cap: int, spent: int, *, join: bool) -> bool:
        """Add `amount` (nano-USD) to the job's committed spend if that keeps it within `cap`,
        with `spent` (what answers cost since the last write) added to its spend, and count the
        shard among the holders of a pool when it `join`s; False if the cap refuses."""
        if amount > cap:
            return False
        try:
            self._table.update_item(
                Key={"pk": job_pk(job_id), "sk": "META"},
                UpdateExpression="ADD budget_committed :a, budget_spent :s, budget_holders :h",
                ConditionExpression=Attr("budget_committed").lte(cap - amount),
                ExpressionAttributeValues={":a": amount, ":s": spent, ":h": 1 if join else 0},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def budget_state(self, job_id: str) -> tuple[int, int]:
        """The job's committed spend (nano-USD) and how many shards hold a pool of it."""
        row = self._table.get_item(
            Key={"pk": job_pk(job_id), "sk": "META"},
            ProjectionExpression="budget_committed, budget_holders",
            ConsistentRead=True,
        ).get("Item", {})
        return int(row.get("budget_committed", 0)), int(row.get("budget_holders", 0))

    def release_budget(self, job_id: str, amount: int, spent: int, *, leave: bool) -> None:
        """Give back (negative `amount`) or add to the committed spend, record `spent`, and stop
        counting the shard among the holders when it `leave`s; unconditional."""
        self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": "META"},
            UpdateExpression="ADD budget_committed :a, budget_spent :s, budget_holders :h",
            ExpressionAttributeValues={":a": amount, ":s": spent, ":h": -1 if leave else 0},
        )

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
        """Checkpoint a shard run: item rows in batches, then one counter update per row kind."""
        expires = self._expires()
        with self._table.batch_writer(overwrite_by_pkeys=["pk", "sk"]) as batch:
            for item in items:
                batch.put_item(
                    Item=_dynamo(
                        {
                            "pk": job_pk(job_id),
                            "sk": item_sk(item.line),
                            "shard": shard,
                            "line": item.line,
                            "custom_id": item.custom_id,
                            "status": item.status,
                            "attempts": item.attempts,
                            "provider_id": item.provider_id,
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
                            "pk": f"RESP#{item.provider_id}",
                            "sk": "RESP",
                            "job_id": job_id,
                            "shard": shard,
                            "line": item.line,
                            "expires_at": expires,
                        }
                    )
        self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": shard_sk(shard)},
            UpdateExpression="SET #s = :s, runs = :run ADD done :d, failed :f, waiting :w",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={
                ":s": "DONE" if finished else "RUNNING",
                ":run": run,
                ":d": done,
                ":f": failed,
                ":w": waiting,
            },
        )
        if done or failed:
            self._table.update_item(
                Key={"pk": job_pk(job_id), "sk": "META"},
                UpdateExpression="ADD done :d, failed :f",
                ExpressionAttributeValues={":d": done, ":f": failed},
            )

    def items(self, job_id: str, first_line: int, last_line: int) -> Iterator[ItemState]:
        """Item rows of one shard: its lines are one contiguous range of sort keys."""
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": Key("pk").eq(job_pk(job_id))
            & Key("sk").between(item_sk(first_line), item_sk(last_line)),
            "ConsistentRead": True,
        }
        while True:
            page = self._table.query(**kwargs)
            for row in page.get("Items", []):
                yield ItemState(
                    line=int(row["line"]),
                    custom_id=row["custom_id"],
                    status=row["status"],
                    provider_id=row.get("provider_id"),
                    attempts=int(row.get("attempts", 0)),
                    error=row.get("error"),
                    swept=bool(row.get("swept", False)),
                )
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def item(self, job_id: str, line: int) -> dict[str, Any] | None:
        row = self._table.get_item(Key={"pk": job_pk(job_id), "sk": item_sk(line)}).get("Item")
        return _plain(row) if row else None

    def item_by_custom_id(self, job_id: str, custom_id: str) -> dict[str, Any] | None:
        """The item row of one request, if it has one (failures, background and batch requests do).

        One partition, filtered: it reads only this job's item rows, never the table.
        """
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": Key("pk").eq(job_pk(job_id)) & Key("sk").begins_with("ITEM#"),
            "FilterExpression": Attr("custom_id").eq(custom_id),
        }
        while True:
            page = self._table.query(**kwargs)
            if page.get("Items"):
                return dict(_plain(page["Items"][0]))
            if "LastEvaluatedKey" not in page:
                return None
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def job(self, job_id: str) -> dict[str, Any] | None:
        row = self._table.get_item(Key={"pk": job_pk(job_id), "sk": "META"}).get("Item")
        return _plain(row) if row else None

    def shards(self, job_id: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": Key("pk").eq(job_pk(job_id)) & Key("sk").begins_with("SHARD#")
        }
        while True:
            page = self._table.query(**kwargs)
            rows.extend(_plain(r) for r in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return rows
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def finish_job(self, job_id: str, *, status: str, summary: dict[str, Any]) -> None:
        self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": "META"},
            UpdateExpression="SET #s = :s, summary = :summary, finished_at = :t",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues=_dynamo({":s": status, ":summary": summary, ":t": self._clock()}),
        )

    def remember_webhook(self, webhook_id: str, now: float) -> bool:
        """Record a webhook id once; False when it was seen before (a replay or a duplicate)."""
        try:
            self._table.put_item(
                Item={
                    "pk": f"WEBHOOK#{webhook_id}",
                    "sk": "META",
                    "seen_at": int(now),
                    "expires_at": int(now) + 7 * 86400,
                },
                ConditionExpression=Attr("pk").not_exists(),
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def _by_provider_id(self, provider_id: str) -> dict[str, Any] | None:
        page = self._table.query(
            IndexName=PROVIDER_ID_INDEX, KeyConditionExpression=Key(PROVIDER_ID_ATTRIBUTE).eq(provider_id)
        )
        rows = page.get("Items", [])
        return rows[0] if rows else None

    def settle_item(self, response_id: str) -> str | None:
        """Mark a submitted item settled; the shard's task token when that was its last wait.

        A fast provider can finish a response before the submitter has stored its id, so the
        webhook also leaves a marker the submitter checks once its item rows are written.
        """
        key = {"pk": f"RESP#{response_id}", "sk": "RESP"}
        row = self._table.get_item(Key=key, ConsistentRead=True).get("Item")
        if row is None:
            self._table.put_item(Item={"pk": f"EARLY#{response_id}", "sk": "EARLY", "expires_at": self._expires()})
            # the submitter may have stored the row between the read and the marker: look once more
            row = self._table.get_item(Key=key, ConsistentRead=True).get("Item")
            if row is None:
                return None
        return self._settle_row(job_pk(str(row["job_id"])), item_sk(int(row["line"])), int(row["shard"]))

    def settle_early(self, job_id: str, shard: int, items: list[ItemState]) -> int:
        """Settle the just-stored items whose webhooks came before their rows; returns how many."""
        by_id = {item.provider_id: item for item in items if item.provider_id}
        ids = list(by_id)
        settled = 0
        resource = self._table.meta.client
        for start in range(0, len(ids), 100):
            keys = [{"pk": f"EARLY#{rid}", "sk": "EARLY"} for rid in ids[start : start + 100]]
            request = {self._table.name: {"Keys": keys, "ProjectionExpression": "pk"}}
            while request:
                answer = resource.batch_get_item(RequestItems=request)
                for row in answer.get("Responses", {}).get(self._table.name, []):
                    item = by_id[row["pk"].removeprefix("EARLY#")]
                    self._settle_row(job_pk(job_id), item_sk(item.line), shard)
                    settled += 1
                request = answer.get("UnprocessedKeys") or {}
        return settled

    def _settle_row(self, pk: str, sk: str, shard: int) -> str | None:
        try:
            self._table.update_item(
                Key={"pk": pk, "sk": sk},
                UpdateExpression="SET #s = :settled",
                ConditionExpression=Attr("status").eq("submitted"),
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={":settled": "settled"},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                # settled before, perhaps by a delivery whose wake then failed: wake again if
                # the shard has nothing left to wait for (a used token is refused harmlessly)
                return _token_if_nothing_waits(self._shard_row(pk, shard_sk(shard)))
            raise
        row = self._table.update_item(
            Key={"pk": pk, "sk": shard_sk(shard)},
            UpdateExpression="ADD waiting :minus",
            ExpressionAttributeValues={":minus": -1},
            ReturnValues="ALL_NEW",
        )["Attributes"]
        return _token_if_nothing_waits(row)

    def settle_batch(self, batch_id: str, status: str) -> str | None:
        row = self._by_provider_id(batch_id)
        if row is None or not str(row["sk"]).startswith("SHARD#"):
            return None
        try:
            shard = self._table.update_item(
                Key={"pk": row["pk"], "sk": row["sk"]},
                UpdateExpression="SET batch_settled = :s",
                ConditionExpression=Attr("batch_settled").not_exists(),
                ExpressionAttributeValues={":s": status},
                ReturnValues="ALL_NEW",
            )["Attributes"]
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                # reported before, perhaps by a delivery whose wake then failed: wake again
                return _token(self._shard_row(row["pk"], row["sk"]))
            raise
        return _token(shard)

    def _shard_row(self, pk: str, sk: str) -> dict[str, Any]:
        return dict(self._table.get_item(Key={"pk": pk, "sk": sk}, ConsistentRead=True).get("Item") or {})

    def arm_shard(self, job_id: str, shard: int, token: str) -> bool:
        """Leave the shard's task token for webhooks; True when nothing is left to wait for."""
        row = self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": shard_sk(shard)},
            UpdateExpression="SET #t = :t",
            ExpressionAttributeNames={"#t": "token"},
            ExpressionAttributeValues={":t": token},
            ReturnValues="ALL_NEW",
        )["Attributes"]
        if row.get("provider_id"):
            return "batch_settled" in row
        return int(row.get("waiting", 0)) <= 0

    def shard(self, job_id: str, shard: int) -> dict[str, Any] | None:
        row = self._shard_row(job_pk(job_id), shard_sk(shard))
        return _plain(row) if row else None

    def begin_batch_submit(self, job_id: str, shard: int, now: float) -> float | None:
        """Stamp the shard's first SubmitBatch; the stamp of an earlier attempt if there was one.

        A retried submit uses it to know whether it must look for batches it created before.
        """
        old = self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": shard_sk(shard)},
            UpdateExpression="SET batch_submit_at = if_not_exists(batch_submit_at, :now)",
            ExpressionAttributeValues={":now": _dynamo(float(now))},
            ReturnValues="ALL_OLD",
        ).get("Attributes", {})
        stamp = old.get("batch_submit_at")
        return float(stamp) if stamp is not None else None

    def set_shard_batches(self, job_id: str, shard: int, batch_ids: list[str]) -> None:
        """Record every batch the shard owns, in part order ("" for a file still waiting for room
        in the provider's queue); `provider_id` (the webhook index) names the first, which
        CollectBatch moves on to the next unfinished one."""
        first = next((batch_id for batch_id in batch_ids if batch_id), None)
        if first is None:
            return
        self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": shard_sk(shard)},
            UpdateExpression=(
                "SET batch_ids = :ids, provider_id = :first, batch_states = if_not_exists(batch_states, :none)"
            ),
            ExpressionAttributeValues={":ids": list(batch_ids), ":first": first, ":none": {}},
        )

    def plan_batch_parts(self, job_id: str, shard: int, parts: list[dict[str, Any]]) -> None:
        """Record the shard's batch files (model, tokens, lines each), none of them created yet."""
        self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": shard_sk(shard)},
            UpdateExpression=(
                "SET batch_parts = :parts, batch_ids = :ids, batch_tries = :none,"
                " batch_states = if_not_exists(batch_states, :none)"
            ),
            ExpressionAttributeValues={":parts": _dynamo(parts), ":ids": [""] * len(parts), ":none": {}},
        )

    def requeue_batch(
        self, job_id: str, shard: int, batch_ids: list[str], tries: dict[str, int], retry_at: float
    ) -> None:
        """A batch the provider's full queue refused: its file waits again ("" in `batch_ids`) under
        the next attempt number, and the shard creates nothing before `retry_at`."""
        self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": shard_sk(shard)},
            UpdateExpression=(
                "SET batch_ids = :ids, batch_tries = :tries, batch_retry_at = :at ADD batch_requeued :one"
            ),
            ExpressionAttributeValues={
                ":ids": list(batch_ids),
                ":tries": dict(tries),
                ":at": _dynamo(float(retry_at)),
                ":one": 1,
            },
        )

    def mark_batch_collected(self, job_id: str, shard: int, batch_id: str, state: dict[str, Any]) -> None:
        self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": shard_sk(shard)},
            UpdateExpression="SET batch_states.#b = :state",
            ExpressionAttributeNames={"#b": batch_id},
            ExpressionAttributeValues={":state": _dynamo(state)},
        )

    def await_batch(self, job_id: str, shard: int, batch_id: str) -> None:
        """Point the webhook index at the batch the shard waits on next, and forget the last wake-up.

        A webhook for this batch that lands before the update is lost, which costs one polling
        interval; a stale `batch_settled` kept instead would wake the shard in a busy loop.
        """
        self._table.update_item(
            Key={"pk": job_pk(job_id), "sk": shard_sk(shard)},
            UpdateExpression="SET provider_id = :p REMOVE batch_settled",
            ExpressionAttributeValues={":p": batch_id},
        )
