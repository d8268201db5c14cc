"""What every reader and writer of job state shares: values in and out of DynamoDB, batched reads
that back off, and one call on many shard rows at once. `JobStore` (`sluice.store.jobs`) is built on it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple, TypeVar

from botocore.exceptions import ClientError

from sluice.contract import causes
from sluice.core.retry import table_retry_delay_s

T = TypeVar("T")

# BatchGetItem's most keys a call
BATCH_GET_KEYS = 100
# calls in flight when one update or query goes to every shard of a job (stop marks, a cancel's
# look for open work): each shard row is a partition of its own, so they do not contend, and
# 1,000 rows take about a second
SHARD_WORKERS = 16
# a pass through a job's shards (Merge, MarkFailed, a cancel) starts at most this many shards a
# second: unpaced, four failed jobs' passes at once read and write past half a new table's warm
# throughput (docs/capacity.md); a job of 2,000 shards takes 10 s more
SHARD_PASS_PER_S = 200


def plain(value: Any) -> Any:
    """DynamoDB hands numbers back as Decimal; the workflow wants JSON numbers."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def dynamo(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(str(value))
    if isinstance(value, dict):
        return {k: dynamo(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [dynamo(v) for v in value]
    return value


def _lost_race(exc: ClientError) -> bool:
    return bool(exc.response["Error"]["Code"] == "ConditionalCheckFailedException")


def conditional(write: Callable[..., Any], **request: Any) -> dict[str, Any] | None:
    """One conditional write (a Table's `put_item` or `update_item` with `request`): what it
    answered, or None when its condition failed (another writer came first). Every conditional
    write of the store goes through here: a lost race is an answer, any other error is raised."""
    try:
        answer: dict[str, Any] = write(**request)
    except ClientError as exc:
        if _lost_race(exc):
            causes.instead(causes.RACE)
            return None
        raise
    return answer


def each_shard(call: Callable[[int], T], shards: Iterable[int], *, per_s: float = SHARD_PASS_PER_S) -> list[T]:
    """`call` for every shard, SHARD_WORKERS at a time and at most `per_s` started a second, the
    answers in shard order."""
    started = time.monotonic()

    def paced(nth: int, shard: int) -> T:
        wait = started + nth / per_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        return call(shard)

    with ThreadPoolExecutor(max_workers=SHARD_WORKERS, thread_name_prefix="shard-rows") as pool:
        listed = list(shards)
        return list(pool.map(paced, range(len(listed)), listed))


class BudgetState(NamedTuple):
    """The job row's figures a waiting shard looks at."""

    committed: int
    holders: int


@dataclass
class ItemState:
    line: int
    custom_id: str
    status: str
    provider_id: str | None = None
    attempts: int = 0
    error: str | None = None
    # sent again by the last sweep (`sluice.shard.sweep`): a background line keeps the mark until collected
    swept: bool = False


class Rows:
    """The table and what every kind of row needs. `table` is a boto3 DynamoDB Table resource."""

    def __init__(
        self,
        table: Any,
        *,
        ttl_days: int,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._table = table
        self._ttl_s = ttl_days * 86400
        self._clock = clock
        self._sleep = sleep
        self._rand = rand

    @property
    def table(self) -> Any:
        """The table resource, for the items that are not job state (`shared_limit`'s buckets)."""
        return self._table

    def _expires(self) -> int:
        return int(self._clock()) + self._ttl_s

    def _batch_get(
        self,
        keys: list[dict[str, str]],
        *,
        projection: str | None = None,
        names: dict[str, str] | None = None,
        consistent: bool = False,
    ) -> list[dict[str, Any]]:
        """The rows of `keys` that exist, in no particular order; keys DynamoDB leaves unprocessed
        (throttled) are asked again after a jittered backoff."""
        client = self._table.meta.client
        rows: list[dict[str, Any]] = []
        for start in range(0, len(keys), BATCH_GET_KEYS):
            ask: dict[str, Any] = {"Keys": keys[start : start + BATCH_GET_KEYS], "ConsistentRead": consistent}
            if projection:
                ask["ProjectionExpression"] = projection
            if names:
                ask["ExpressionAttributeNames"] = names
            request: dict[str, Any] = {self._table.name: ask}
            attempt = 0
            while request:
                answer = client.batch_get_item(RequestItems=request)
                rows.extend(answer.get("Responses", {}).get(self._table.name, []))
                request = answer.get("UnprocessedKeys") or {}
                if request:
                    attempt += 1
                    self._sleep(table_retry_delay_s(attempt, self._rand))
        return rows
