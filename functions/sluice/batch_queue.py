"""The provider's Batch queue limit, shared by every shard of every job on the same key (issue 16).

A provider counts the input tokens of an organization's batches that are still validating,
in progress or finalizing, per model, and fails a new batch that would take the sum over its
limit (`token_limit_exceeded`). Shards cannot see each other's batches, so before creating one
a shard reserves its tokens on one item in the jobs table, next to the shared rate limit's and
keyed the same way (`shared_limit.limit_key`: base URL and key hash, model), sort key `QUEUE`.
The item maps each hold (`<job>#<shard>#<part>#<attempt>`) to its tokens and when it was taken;
a reservation reads the item and writes it back conditionally on `version`, and a release
removes one hold. So each batch costs two writes (and one more per lost race, after a jittered
backoff: `retry.table_retry_delay_s`), never one per line.

Leak-safe: a shard that dies between reserving and releasing must not hold the queue forever.
A hold lapses on its own after the 24-hour completion window, and when a reservation finds no
room it reconciles first: holds older than a grace period whose batch is not among the
provider's own active batches (matched by metadata) are dropped.

Tokens are estimated as a quarter of the request body's bytes, rounded up. Tokenizers give
about four characters a token of English; counting the whole body (field names, quotes, the
model) as well as the prompt leans high, so an estimate under the limit is under it at the
provider too, barring batches the key runs outside Sluice, which `token_limit_exceeded` covers.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError

from .model import Request
from .retry import table_retry_delay_s
from .shared_limit import limit_key

QUEUE_SORT_KEY = "QUEUE"
TOKEN_LIMIT_EXCEEDED = "token_limit_exceeded"
# the provider ends every batch within its 24-hour completion window; an hour more for clocks
HOLD_MAX_S = 25 * 3600
# a hold this young may belong to a batch being created right now: reconciling keeps it
HOLD_GRACE_S = 900.0
# the item outlives its last hold by a day, like the rate limiter's
QUEUE_TTL_S = 86_400
# batches that hold their tokens at the provider
ACTIVE_STATUSES = frozenset({"validating", "in_progress", "finalizing", "cancelling"})
# lost races before a reservation gives up for this round (the shard asks again later)
MAX_RACES = 8


def estimate_tokens(request: Request) -> int:
    """Input tokens the provider will count for `request`: a quarter of its body's bytes, rounded up."""
    return max(1, -(-len(request.body or b"") // 4))


def queue_key(base_url: str, api_key: str, model: str | None) -> str:
    return limit_key(base_url, api_key, model or "")


def hold_ref(job_id: str, shard: int, part: int, attempt: int) -> str:
    return f"{job_id}#{shard}#{part}#{attempt}"


@dataclass(frozen=True)
class Hold:
    tokens: int
    since: float


@dataclass(frozen=True)
class Queue:
    """The item's state: live holds by reference, and the version the next write must follow."""

    holds: Mapping[str, Hold] = field(default_factory=dict)
    version: int = 0

    def enqueued(self, now: float, *, besides: str | None = None) -> int:
        return sum(h.tokens for ref, h in self.holds.items() if ref != besides and h.since + HOLD_MAX_S > now)


def admit(queue: Queue, ref: str, tokens: int, limit: int, now: float) -> Queue | None:
    """The queue with `ref` holding `tokens`, or None when they do not fit under `limit` (0 = none).

    A part larger than the whole limit (one huge row) goes when the queue is otherwise empty:
    it can never fit, and the provider's own count may be lower than the estimate.
    """
    used = queue.enqueued(now, besides=ref)
    if limit > 0 and used > 0 and used + tokens > limit:
        return None
    live = {r: h for r, h in queue.holds.items() if r != ref and h.since + HOLD_MAX_S > now}
    live[ref] = Hold(tokens, now)
    return Queue(live, queue.version + 1)


def stale(queue: Queue, active: set[str], now: float) -> list[str]:
    """Holds past the grace period whose batch the provider does not list as active."""
    return [ref for ref, h in queue.holds.items() if ref not in active and h.since + HOLD_GRACE_S <= now]


class QueueTable:
    """The queue items' reads and writes; `table` is a boto3 DynamoDB Table resource."""

    def __init__(
        self,
        table: Any,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._table = table
        self._clock = clock
        self._sleep = sleep
        self._rand = rand
        self.reads = 0
        self.writes = 0

    def load(self, pk: str) -> Queue:
        self.reads += 1
        item = self._table.get_item(Key={"pk": pk, "sk": QUEUE_SORT_KEY}, ConsistentRead=True).get("Item")
        if item is None:
            return Queue()
        holds = {
            str(ref): Hold(int(h["tokens"]), float(h["since"])) for ref, h in dict(item.get("holds") or {}).items()
        }
        return Queue(holds, int(item.get("version", 0)))

    def save(self, pk: str, queue: Queue) -> bool:
        """Write `queue` if nobody wrote since it was read; False if somebody did."""
        self.writes += 1
        values: dict[str, Any] = {
            ":holds": {
                ref: {"tokens": h.tokens, "since": Decimal(repr(round(h.since, 3)))} for ref, h in queue.holds.items()
            },
            ":version": queue.version,
            ":expires": int(self._clock()) + HOLD_MAX_S + QUEUE_TTL_S,
        }
        if queue.version > 1:
            condition = "version = :previous"
            values[":previous"] = queue.version - 1
        else:
            condition = "attribute_not_exists(version)"
        try:
            self._table.update_item(
                Key={"pk": pk, "sk": QUEUE_SORT_KEY},
                UpdateExpression="SET holds = :holds, version = :version, expires_at = :expires",
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def lost(self, attempt: int) -> None:
        """After `attempt` lost races on the item: wait before reading it again, so shards that
        collided do not read and write again in step."""
        self._sleep(table_retry_delay_s(attempt, self._rand))

    def release(self, pk: str, ref: str) -> None:
        """Drop one hold; the version moves on, so a reservation that read it before tries again."""
        self.writes += 1
        try:
            self._table.update_item(
                Key={"pk": pk, "sk": QUEUE_SORT_KEY},
                UpdateExpression="REMOVE holds.#r ADD version :one",
                ConditionExpression="attribute_exists(holds.#r)",
                ExpressionAttributeNames={"#r": ref},
                ExpressionAttributeValues={":one": 1},
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise


@dataclass(frozen=True)
class Reservation:
    """`granted`, or the tokens already enqueued when there was no room. `held_since` is when an
    earlier attempt took this very hold: it may have created the batch before it died."""

    granted: bool
    enqueued: int = 0
    held_since: float | None = None


def reserve(table: QueueTable, pk: str, ref: str, tokens: int, limit: int, now: float) -> Reservation:
    for attempt in range(1, MAX_RACES + 1):
        queue = table.load(pk)
        held = queue.holds.get(ref)
        if held is not None:
            return Reservation(True, held_since=held.since)
        taken = admit(queue, ref, tokens, limit, now)
        if taken is None:
            return Reservation(False, enqueued=queue.enqueued(now))
        if table.save(pk, taken):
            return Reservation(True)
        if attempt < MAX_RACES:
            table.lost(attempt)
    return Reservation(False, enqueued=limit)


def forget(table: QueueTable, pk: str, active: set[str], now: float) -> int:
    """Drop the stale holds (see `stale`); how many went."""
    for attempt in range(1, MAX_RACES + 1):
        queue = table.load(pk)
        gone = stale(queue, active, now)
        if not gone:
            return 0
        kept = {ref: h for ref, h in queue.holds.items() if ref not in gone}
        if table.save(pk, Queue(kept, queue.version + 1)):
            return len(gone)
        if attempt < MAX_RACES:
            table.lost(attempt)
    return 0


def active_refs(batches: Iterable[Any]) -> set[str]:
    """The hold references of the provider's active Sluice batches, from their metadata."""
    refs: set[str] = set()
    for batch in batches:
        metadata = getattr(batch, "metadata", None) or {}
        numbers = [str(metadata.get(name, "")) for name in ("shard", "part")] + [str(metadata.get("try", "1"))]
        if batch.status in ACTIVE_STATUSES and "job" in metadata and all(n.isdigit() for n in numbers):
            shard, part, attempt = map(int, numbers)
            refs.add(hold_ref(str(metadata["job"]), shard, part, attempt))
    return refs


def limit_exceeded(batch: Any) -> bool:
    """Whether the provider failed `batch` because its queue was full: wait and resubmit."""
    if batch.status != "failed" or not batch.errors:
        return False
    return any((problem.code or "") == TOKEN_LIMIT_EXCEEDED for problem in batch.errors.data or [])
