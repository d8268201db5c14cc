"""The shared limit's items in the jobs table: one per provider key and model, under 1 KB each.

`sluice.limits.shared` names the item (`LIMIT#<hash>#<model>`, sort key `LIMIT`); this module reads
and writes its state (`sluice.limits.lease.Bucket`): numbers, plus the seats packed as 2-byte whole
seconds past `seats_at`, so the item's size does not grow with the number of shards drawing on it.

Before the rate is known the item is a placeholder (`Learning`): the shard that claimed it learns
the rate from its answers while the others wait; it says `open` when the answers carry no rate
(errors, timeouts: everyone sends, and learns from its own answers) and `off` when the provider
answers without rate headers at all (nothing to share). The bucket replaces it.
"""

from __future__ import annotations

import math
import random
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sluice.contract import PARTITION_KEY, SORT_KEY, causes
from sluice.core.retry import table_retry_delay_s
from sluice.limits.lease import SEAT_MAX_S, SEATS, Bucket, LeasePolicy
from sluice.store.rows import conditional

LIMIT_SORT_KEY = "LIMIT"
# the item outlives a job by this much: long enough for the next job to find the learned rate
LIMIT_TTL_S = 86_400

# a placeholder's states: a shard is learning the rate; its answers carried none; the provider sends none
LEARNING = "learning"
OPEN = "open"
OFF = "off"


@dataclass(frozen=True)
class Learning:
    """The placeholder of a key whose rate nobody knows yet: since when, and in which state."""

    since: float
    state: str = LEARNING


_PACKED = struct.Struct(f">{SEATS}H")


def encode_seats(seats: Sequence[float], base: int) -> bytes:
    """The seats as 2-byte whole seconds past `base` (0: empty), `SEATS` of them."""
    if len(seats) != SEATS:
        return bytes(_PACKED.size)
    return _PACKED.pack(*(min(SEAT_MAX_S, math.ceil(until - base)) if until > base else 0 for until in seats))


def decode_seats(raw: bytes, base: int) -> tuple[float, ...]:
    if len(raw) != _PACKED.size:
        return ()
    return tuple(float(base + offset) if offset else 0.0 for offset in _PACKED.unpack(raw))


class BucketTable:
    """The bucket items' reads and writes; `table` is a boto3 DynamoDB Table resource. `sleep`
    and `rand` space out the tries of a change that lost its conditional write."""

    def __init__(
        self,
        table: Any,
        clock: Callable[[], float] = time.time,
        *,
        policy: LeasePolicy | None = None,
        sleep: Callable[[float], object] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._table = table
        self._clock = clock
        self._policy = policy or LeasePolicy()
        self._sleep = sleep
        self._rand = rand
        self.reads = 0
        self.writes = 0

    def load(self, pk: str) -> Bucket | None:
        found = self.look(pk)
        return found if isinstance(found, Bucket) else None

    def look(self, pk: str) -> Bucket | Learning | None:
        """The key's bucket, its placeholder, or None when there is neither."""
        self.reads += 1
        item = self._table.get_item(Key={PARTITION_KEY: pk, SORT_KEY: LIMIT_SORT_KEY}, ConsistentRead=True).get("Item")
        if item is None:
            return None
        if "rate" not in item:
            if "learning_at" in item:
                return Learning(float(item["learning_at"]), str(item.get("learning", LEARNING)))
            return None
        raw = item.get("seats")
        seats = getattr(raw, "value", raw)
        return Bucket(
            rate=float(item["rate"]),
            level=float(item["level"]),
            stamp=float(item["stamp"]),
            version=int(item["version"]),
            seats=decode_seats(bytes(seats), int(item.get("seats_at", 0))) if seats else (),
            token_rate=float(item.get("token_rate", 0)),
            token_level=float(item.get("token_level", 0)),
            paused_until=float(item.get("paused_until", 0)),
            window_s=float(item.get("window_s", 0)),
            since=float(item.get("since", 0)),
        )

    def save(self, pk: str, bucket: Bucket) -> bool:
        """Write `bucket` if nobody wrote since it was read (version - 1); False if somebody did."""
        self.writes += 1
        now = int(self._clock())
        values = {
            ":rate": _decimal(bucket.rate),
            ":level": _decimal(bucket.level),
            ":stamp": _decimal(bucket.stamp),
            ":version": bucket.version,
            ":seats": encode_seats(bucket.seats, now),
            ":seats_at": now,
            ":token_rate": _decimal(bucket.token_rate),
            ":token_level": _decimal(bucket.token_level),
            ":paused": _decimal(bucket.paused_until),
            ":window": _decimal(bucket.window_s),
            ":since": _decimal(bucket.since),
            ":expires": now + LIMIT_TTL_S,
        }
        if bucket.version > 1:
            condition = "version = :previous"
            values[":previous"] = bucket.version - 1
        else:
            condition = "attribute_not_exists(version)"
        # `lessees` is the per-lessee map items held before the seats: gone at the first write
        expression = (
            "SET rate = :rate, #level = :level, stamp = :stamp, version = :version, seats = :seats, "
            "seats_at = :seats_at, token_rate = :token_rate, token_level = :token_level, "
            "paused_until = :paused, window_s = :window, since = :since, expires_at = :expires "
            "REMOVE lessees, learning_at, learning"
        )
        return self._update(pk, expression, condition, values, names={"#level": "level"})

    def claim(self, pk: str, now: float, stale: Learning | None = None) -> bool:
        """Make (or take over a `stale`) placeholder: True if this caller is to learn the rate."""
        self.writes += 1
        values: dict[str, Any] = {":at": _decimal(now), ":state": LEARNING, ":expires": int(now) + LIMIT_TTL_S}
        if stale is None:
            condition = "attribute_not_exists(learning_at) AND attribute_not_exists(version)"
        else:
            condition = "learning_at = :since AND attribute_not_exists(version)"
            values[":since"] = _decimal(stale.since)
        return self._update(pk, "SET learning_at = :at, learning = :state, expires_at = :expires", condition, values)

    def mark(self, pk: str, state: str) -> None:
        """Say what the learning shard heard (`OPEN`, `OFF`), unless a bucket replaced the placeholder."""
        self.writes += 1
        values = {":state": state, ":expires": int(self._clock()) + LIMIT_TTL_S}
        self._update(pk, "SET learning = :state, expires_at = :expires", "attribute_not_exists(version)", values)

    def _update(
        self, pk: str, expression: str, condition: str, values: dict[str, Any], names: dict[str, str] | None = None
    ) -> bool:
        """The conditional update; False if its condition failed (another shard wrote first)."""
        answer = conditional(
            self._table.update_item,
            Key={PARTITION_KEY: pk, SORT_KEY: LIMIT_SORT_KEY},
            UpdateExpression=expression,
            ConditionExpression=condition,
            ExpressionAttributeValues=values,
            **({"ExpressionAttributeNames": names} if names else {}),
        )
        return answer is not None

    def change(self, pk: str, how: Callable[[Bucket], Bucket | None]) -> bool:
        """Read, change and write the item, again after a jittered wait if another shard wrote in
        between; `how` returns None when there is nothing to change. False if the item is gone or
        stays contended."""
        for tries in range(1, self._policy.write_tries + 1):
            with causes.again(tries):
                bucket = self.load(pk)
                if bucket is None:
                    return False
                new = how(bucket)
                if new is None:
                    return True
                if self.save(pk, new):
                    return True
            self._sleep(table_retry_delay_s(tries, self._rand))
        return False


def _decimal(value: float) -> Decimal:
    return Decimal(repr(round(value, 6)))
