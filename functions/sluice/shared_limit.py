"""One provider rate limit shared by every shard of every running job on the same key (issue 16).

A provider counts requests per (API key, model), whatever process sends them, so a budget each
shard keeps to itself lets N shards send N times the quota. The shared budget is a token bucket
in the jobs table, one item per limiter key: `LIMIT#<hash of base URL and key>#<model>`. The
bucket refills lazily by time: whoever reads it works out its level from `level`, `stamp` and
`rate`, and a conditional write (on `version`) takes a lease.

A lease is a whole period's worth of one lessee's fair share (the rate divided by the lessees
that leased lately), at least `min_requests`, so a shard writes once per `min_requests` lines
or fewer; it spends the lease locally and returns nothing. A lessee may not lease again before
its period is over, so a shard that answers faster cannot take more than its share.

The rate is learned: until the item has one, each shard sends one request at a time, and the
first `x-ratelimit-limit-requests` header seen sets it. A provider that sends no such header
leaves the limiter off.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import orjson
from botocore.exceptions import ClientError

from .model import Request

LIMIT_SORT_KEY = "LIMIT"
# the item outlives a job by this much: long enough for the next job to find the learned rate
LIMIT_TTL_S = 86_400


def limit_key(base_url: str, api_key: str, model: str) -> str:
    """The limiter's partition key. Only a hash prefix of the key is stored: a table reader
    can tell two keys apart but learns nothing that lets them call the provider."""
    digest = hashlib.sha256(f"{base_url.rstrip('/')}|{api_key}".encode()).hexdigest()[:16]
    return f"LIMIT#{digest}#{model}"


@dataclass(frozen=True)
class LeasePolicy:
    # a lease is at least this many requests, so writes per line stay at or under 1/min_requests
    min_requests: int = 25
    # ... and at least this long a period
    min_period_s: float = 2.0
    # the bucket holds this many seconds of the rate: the burst after an idle spell
    burst_s: float = 10.0
    # a lessee whose period ended this long ago no longer counts toward the shares
    idle_s: float = 5.0


@dataclass(frozen=True)
class Bucket:
    """The item's state. `lessees` maps a lessee to the end of its current period."""

    rate: float  # requests a second
    level: float
    stamp: float
    version: int = 0
    lessees: Mapping[str, float] = field(default_factory=dict)

    def capacity(self, policy: LeasePolicy) -> float:
        return max(1.0, self.rate * policy.burst_s)


@dataclass(frozen=True)
class Grant:
    """`requests` > 0 with the bucket to write back, or 0 and how long to wait before asking again."""

    requests: int
    wait_s: float
    bucket: Bucket | None = None


def refill(bucket: Bucket, now: float, policy: LeasePolicy) -> float:
    """The level at `now`: what was left plus the rate times the time since, up to capacity."""
    elapsed = max(0.0, now - bucket.stamp)
    return min(bucket.capacity(policy), bucket.level + elapsed * bucket.rate)


def lease(bucket: Bucket, lessee: str, now: float, policy: LeasePolicy) -> Grant:
    """What `lessee` may take at `now`: one period of its fair share, or a wait."""
    active = {name: until for name, until in bucket.lessees.items() if until + policy.idle_s > now}
    own_until = active.get(lessee, 0.0)
    if own_until > now:
        return Grant(0, own_until - now)
    count = len(active) + (0 if lessee in active else 1)
    share = bucket.rate / count
    period = max(policy.min_period_s, policy.min_requests / share)
    want = max(1, min(math.floor(share * period), math.floor(bucket.capacity(policy))))
    level = refill(bucket, now, policy)
    if level < want:
        return Grant(0, (want - level) / bucket.rate)
    active[lessee] = now + period
    taken = Bucket(bucket.rate, level - want, now, bucket.version + 1, active)
    return Grant(want, 0.0, taken)


def learned_rate(headers: Mapping[str, str]) -> float | None:
    """Requests a second from the provider's `x-ratelimit-limit-requests` (a per-minute figure)."""
    raw = headers.get("x-ratelimit-limit-requests")
    if raw is None:
        return None
    try:
        per_minute = float(raw)
    except ValueError:
        return None
    return per_minute / 60.0 if math.isfinite(per_minute) and per_minute > 0 else None


def request_model(req: Request) -> str:
    if req.body:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError:
            return ""
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            return str(body["model"])
    return ""


class BucketTable:
    """The bucket items' reads and writes; `table` is a boto3 DynamoDB Table resource."""

    def __init__(self, table: Any, clock: Callable[[], float] = time.time) -> None:
        self._table = table
        self._clock = clock
        self.reads = 0
        self.writes = 0

    def load(self, pk: str) -> Bucket | None:
        self.reads += 1
        item = self._table.get_item(Key={"pk": pk, "sk": LIMIT_SORT_KEY}, ConsistentRead=True).get("Item")
        if item is None or "rate" not in item:
            return None
        return Bucket(
            rate=float(item["rate"]),
            level=float(item["level"]),
            stamp=float(item["stamp"]),
            version=int(item["version"]),
            lessees={str(k): float(v) for k, v in dict(item.get("lessees") or {}).items()},
        )

    def save(self, pk: str, bucket: Bucket) -> bool:
        """Write `bucket` if nobody wrote since it was read (version - 1); False if somebody did."""
        self.writes += 1
        values = {
            ":rate": _decimal(bucket.rate),
            ":level": _decimal(bucket.level),
            ":stamp": _decimal(bucket.stamp),
            ":version": bucket.version,
            ":lessees": {k: _decimal(v) for k, v in bucket.lessees.items()},
            ":expires": int(self._clock()) + LIMIT_TTL_S,
        }
        if bucket.version > 1:
            condition = "version = :previous"
            values[":previous"] = bucket.version - 1
        else:
            condition = "attribute_not_exists(version)"
        try:
            self._table.update_item(
                Key={"pk": pk, "sk": LIMIT_SORT_KEY},
                UpdateExpression=(
                    "SET rate = :rate, #level = :level, stamp = :stamp, version = :version, "
                    "lessees = :lessees, expires_at = :expires"
                ),
                ConditionExpression=condition,
                ExpressionAttributeNames={"#level": "level"},
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                return False
            raise
        return True


def _decimal(value: float) -> Decimal:
    return Decimal(repr(round(value, 6)))


class _Local:
    """One limiter key as one shard sees it: the unspent rest of its lease."""

    def __init__(self, pk: str) -> None:
        self.pk = pk
        self.tokens = 0
        self.rate: float | None = None
        self.off = False
        self.probing = False
        self.learned = asyncio.Event()
        self.lock = asyncio.Lock()


class SharedLimit:
    """What the engine draws from before each attempt: `take` waits for a leased request,
    `observe` learns the rate from answers. DynamoDB calls run on a thread, off the event loop."""

    def __init__(
        self,
        table: BucketTable,
        *,
        base_url: str,
        api_key: str,
        lessee: str,
        policy: LeasePolicy | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.table = table
        self._base_url = base_url
        self._api_key = api_key
        self.lessee = lessee
        self.policy = policy or LeasePolicy()
        self._clock = clock
        self._sleep = sleep
        self._keys: dict[str, _Local] = {}
        self.waited_s = 0.0

    def _local(self, model: str) -> _Local:
        local = self._keys.get(model)
        if local is None:
            local = self._keys[model] = _Local(limit_key(self._base_url, self._api_key, model))
        return local

    async def take(self, req: Request) -> str:
        """Wait until `req` may be sent; returns the model to pass to `observe`."""
        model = request_model(req)
        local = self._local(model)
        while True:
            if local.off:
                return model
            if local.tokens > 0:
                local.tokens -= 1
                return model
            if local.rate is None:
                if local.probing:
                    await self._wait_learned(local)
                    continue
                local.probing = True
                bucket = await asyncio.to_thread(self.table.load, local.pk)
                if bucket is None:
                    # nobody knows the rate yet: one request at a time until an answer tells it
                    return model
                local.rate = bucket.rate
                local.probing = False
                local.learned.set()
            async with local.lock:
                if local.tokens == 0 and not local.off:
                    local.tokens = await self._lease(local)

    async def _wait_learned(self, local: _Local) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(local.learned.wait(), timeout=1.0)

    async def _lease(self, local: _Local) -> int:
        while True:
            bucket = await asyncio.to_thread(self.table.load, local.pk)
            if bucket is None:
                # the item expired under us: learn the rate again
                local.rate = None
                local.learned.clear()
                return 0
            grant = lease(bucket, self.lessee, self._clock(), self.policy)
            if grant.bucket is None:
                self.waited_s += grant.wait_s
                await self._sleep(grant.wait_s)
                continue
            if await asyncio.to_thread(self.table.save, local.pk, grant.bucket):
                return grant.requests

    def observe(self, model: str, status: int | None, headers: Mapping[str, str] | None) -> None:
        """After an attempt sent past `take`: the first rate header sets the shared rate."""
        local = self._local(model)
        if local.rate is not None or local.off:
            return
        local.probing = False
        if status is None:
            return
        rate = learned_rate(headers) if headers is not None else None
        if rate is None:
            if status < 400:
                # answered without a rate header: this provider tells nothing to share
                local.off = True
                local.learned.set()
            return
        local.rate = rate
        bucket = Bucket(rate=rate, level=_remaining(headers, rate, self.policy), stamp=self._clock(), version=1)
        self.table.save(local.pk, bucket)
        local.learned.set()


def _remaining(headers: Mapping[str, str] | None, rate: float, policy: LeasePolicy) -> float:
    capacity = max(1.0, rate * policy.burst_s)
    raw = headers.get("x-ratelimit-remaining-requests") if headers is not None else None
    try:
        return min(capacity, max(0.0, float(raw))) if raw is not None else capacity
    except ValueError:
        return capacity
