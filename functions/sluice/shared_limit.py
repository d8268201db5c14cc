"""One provider rate limit shared by every shard of every running job on the same key (issue 16).

A provider counts requests and tokens per (API key, model), whatever process sends them, so a
budget each shard keeps to itself lets N shards send N times the quota. The shared budget is
two token buckets, requests and tokens a second, in one item of the jobs table per limiter key:
`LIMIT#<hash of base URL and key>#<model>`. The buckets refill lazily by time: whoever reads the
item works out its levels from `level`, `token_level`, `stamp` and the rates, and a conditional
write (on `version`) takes a lease.

A lease is a whole period's worth of one lessee's fair share of both rates (divided by the
lessees that leased lately), at least `min_requests` requests, so a shard writes once per
`min_requests` lines or fewer. A lessee may not lease again before its period is over, so a shard
that answers faster cannot take more than its share; a lease tops the shard's balance up to the
share, so requests the token rate left unspent do not pile up.

A request's token cost is what OpenAI counts against TPM when it admits one: the input's
characters / 4 plus the most output it may produce (`max_tokens` and its kin, times `n`), as in
OpenAI's cookbook (`api_request_parallel_processor.py`). A request goes while the shard's token
balance is positive; one bigger than the balance leaves a debt the next lease repays. The answer's
`usage` settles the estimate in the shard's balance (no write).

The rates: a seed (the environment's `rate_limits` for the model, else the job's `sluice-rpm` /
`sluice-tpm`) creates the item before any answer, so the first seconds do not overshoot; without
one, each shard sends one request at a time until an answer's `x-ratelimit-limit-requests` (and
`-tokens`) sets them. Headers win over a seed, and when they later report a different limit the
item follows. A provider that sends no such header and has no seed leaves the limiter off.

A 429 that says the quota is spent (`x-ratelimit-remaining-*` used up) drains the item and pauses
it until the provider's Retry-After: every shard stops leasing until then, rather than each
finding out alone. At the end of a run (done, or stopped for the Lambda's time) a shard gives
back what it holds unspent and leaves the lessees, so a short shard strands no capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import orjson
from botocore.exceptions import ClientError

from .contract import RateSeed
from .limits import parse_reset_s
from .model import Request
from .retry import retry_after_s

LIMIT_SORT_KEY = "LIMIT"
# the item outlives a job by this much: long enough for the next job to find the learned rate
LIMIT_TTL_S = 86_400
# OpenAI estimates a request's input tokens from its characters, about 4 a token
CHARS_PER_TOKEN = 4
# the output a request that sets no limit on it is assumed to ask for, until its answer settles it.
# Smaller than the budget's reservation on purpose: this one only paces, and a guess too large
# would hold every shard below the quota it could use
DEFAULT_OUTPUT_TOKENS = 256
# the request body's fields that hold its input text, by endpoint
_INPUT_FIELDS = ("messages", "input", "prompt", "instructions")
_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
# a limit header within this share of the known rate is the same limit (no write)
_SAME_RATE = 0.01
# the weight of the newest request in a key's moving average of token costs
_COST_WEIGHT = 0.05
# conditional writes that lose to another shard are tried again this many times
_WRITE_TRIES = 5


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
    """The item's state. `lessees` maps a lessee to the end of its current period; a
    `token_rate` of 0 means no token limit is known; `paused_until` (epoch seconds) is when a
    429 said the quota refills."""

    rate: float  # requests a second
    level: float
    stamp: float
    version: int = 0
    lessees: Mapping[str, float] = field(default_factory=dict)
    token_rate: float = 0.0  # tokens a second
    token_level: float = 0.0
    paused_until: float = 0.0

    def capacity(self, policy: LeasePolicy) -> float:
        return max(1.0, self.rate * policy.burst_s)

    def token_capacity(self, policy: LeasePolicy) -> float:
        return max(1.0, self.token_rate * policy.burst_s)


@dataclass(frozen=True)
class Grant:
    """With the bucket to write back: `requests` and `tokens` taken (either may be 0 when the
    shard already holds its share of it). Without: how long to wait before asking again."""

    requests: int
    wait_s: float
    bucket: Bucket | None = None
    tokens: float = 0.0


def refill(bucket: Bucket, now: float, policy: LeasePolicy) -> float:
    """The level at `now`: what was left plus the rate times the time since, up to capacity."""
    elapsed = max(0.0, now - bucket.stamp)
    return min(bucket.capacity(policy), bucket.level + elapsed * bucket.rate)


def refill_tokens(bucket: Bucket, now: float, policy: LeasePolicy) -> float:
    elapsed = max(0.0, now - bucket.stamp)
    return min(bucket.token_capacity(policy), bucket.token_level + elapsed * bucket.token_rate)


def lease(
    bucket: Bucket,
    lessee: str,
    now: float,
    policy: LeasePolicy,
    *,
    held: int = 0,
    held_tokens: float = 0.0,
    tokens_per_request: float = 0.0,
) -> Grant:
    """What `lessee`, holding `held` requests and `held_tokens` unspent, may take at `now`: its
    balance topped up to one period of its fair share, or a wait. The period is long enough for
    `min_requests` of either share: of requests, and of tokens at `tokens_per_request` each
    (what the lessee's requests have cost so far), so a token-bound shard writes no more often."""
    if bucket.paused_until > now:
        return Grant(0, bucket.paused_until - now)
    active = {name: until for name, until in bucket.lessees.items() if until + policy.idle_s > now}
    own_until = active.get(lessee, 0.0)
    if own_until > now:
        return Grant(0, own_until - now)
    count = len(active) + (0 if lessee in active else 1)
    share = bucket.rate / count
    period = max(policy.min_period_s, policy.min_requests / share)
    if bucket.token_rate > 0 and tokens_per_request > 0:
        # no longer than the token bucket holds of the share, or the lease would be cut to
        # capacity and the period would starve the lessee
        token_period = policy.min_requests * tokens_per_request * count / bucket.token_rate
        period = max(period, min(token_period, policy.burst_s * count))
    want = max(1, min(math.floor(share * period), math.floor(bucket.capacity(policy))))
    take = max(0, want - held)
    level = refill(bucket, now, policy)
    wait = (take - level) / bucket.rate if level < take else 0.0
    take_tokens = 0.0
    token_level = 0.0
    if bucket.token_rate > 0:
        capacity = bucket.token_capacity(policy)
        want_tokens = min(capacity, bucket.token_rate / count * period)
        # a debt (negative balance) is repaid from this lease, up to the bucket's capacity
        take_tokens = max(0.0, min(capacity, want_tokens - held_tokens))
        token_level = refill_tokens(bucket, now, policy)
        if token_level < take_tokens:
            wait = max(wait, (take_tokens - token_level) / bucket.token_rate)
    if wait > 0:
        return Grant(0, wait)
    active[lessee] = now + period
    taken = replace(
        bucket,
        level=level - take,
        token_level=token_level - take_tokens,
        stamp=now,
        version=bucket.version + 1,
        lessees=active,
    )
    return Grant(take, 0.0, taken, take_tokens)


def give_back(bucket: Bucket, lessee: str, now: float, policy: LeasePolicy, requests: int, tokens: float) -> Bucket:
    """The bucket with what `lessee` leased and did not spend returned, and `lessee` gone from the shares."""
    lessees = {name: until for name, until in bucket.lessees.items() if name != lessee}
    token_level = refill_tokens(bucket, now, policy) if bucket.token_rate > 0 else 0.0
    return replace(
        bucket,
        level=min(bucket.capacity(policy), refill(bucket, now, policy) + max(0, requests)),
        token_level=min(bucket.token_capacity(policy), token_level + max(0.0, tokens)) if bucket.token_rate else 0.0,
        stamp=now,
        version=bucket.version + 1,
        lessees=lessees,
    )


def drained(bucket: Bucket, now: float, until: float) -> Bucket:
    """The bucket after the provider said the quota is spent until `until`: empty, and paused."""
    return replace(bucket, level=0.0, token_level=0.0, stamp=now, version=bucket.version + 1, paused_until=until)


def retuned(bucket: Bucket, now: float, policy: LeasePolicy, rate: float | None, token_rate: float | None) -> Bucket:
    """The bucket following limits the provider now reports; levels kept, within the new capacities."""
    new = replace(
        bucket,
        rate=rate or bucket.rate,
        token_rate=token_rate or bucket.token_rate,
        level=refill(bucket, now, policy),
        token_level=refill_tokens(bucket, now, policy) if bucket.token_rate > 0 else 0.0,
        stamp=now,
        version=bucket.version + 1,
    )
    if bucket.token_rate <= 0 < new.token_rate:
        # a token limit heard of for the first time: the provider's bucket starts full
        new = replace(new, token_level=new.token_capacity(policy))
    return replace(
        new,
        level=min(new.level, new.capacity(policy)),
        token_level=min(new.token_level, new.token_capacity(policy)) if new.token_rate else 0.0,
    )


def _per_second(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        per_minute = float(raw)
    except ValueError:
        return None
    return per_minute / 60.0 if math.isfinite(per_minute) and per_minute > 0 else None


def learned_rate(headers: Mapping[str, str]) -> float | None:
    """Requests a second from the provider's `x-ratelimit-limit-requests` (a per-minute figure)."""
    return _per_second(headers, "x-ratelimit-limit-requests")


def learned_token_rate(headers: Mapping[str, str]) -> float | None:
    """Tokens a second from the provider's `x-ratelimit-limit-tokens` (a per-minute figure)."""
    return _per_second(headers, "x-ratelimit-limit-tokens")


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for v in value.values())
    return 0


def estimate_tokens(body: Mapping[str, Any], path: str = "") -> int:
    """What a request counts against a TPM limit when it is admitted: its input's characters / 4
    plus the most output it may produce, times `n` (an embedding produces none)."""
    chars = sum(_text_chars(body.get(name)) for name in _INPUT_FIELDS)
    tokens = math.ceil(chars / CHARS_PER_TOKEN)
    if path.endswith("/embeddings"):
        return tokens
    limit = next((body[name] for name in _OUTPUT_LIMITS if isinstance(body.get(name), int)), None)
    output = limit if isinstance(limit, int) and limit > 0 else DEFAULT_OUTPUT_TOKENS
    n = body.get("n")
    return tokens + output * (n if isinstance(n, int) and n > 0 else 1)


def used_tokens(body: Any) -> int | None:
    """The tokens an answer's `usage` says it took, or None when it does not say."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")]
    counted = [p for p in parts if isinstance(p, int)]
    return sum(counted) if counted else None


def _parsed(req: Request) -> dict[str, Any] | None:
    if req.body:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError:
            return None
        if isinstance(body, dict):
            return body
    return None


def request_model(req: Request) -> str:
    body = _parsed(req)
    if body is not None and isinstance(body.get("model"), str):
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
            token_rate=float(item.get("token_rate", 0)),
            token_level=float(item.get("token_level", 0)),
            paused_until=float(item.get("paused_until", 0)),
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
            ":token_rate": _decimal(bucket.token_rate),
            ":token_level": _decimal(bucket.token_level),
            ":paused": _decimal(bucket.paused_until),
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
                    "lessees = :lessees, token_rate = :token_rate, token_level = :token_level, "
                    "paused_until = :paused, expires_at = :expires"
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

    def change(self, pk: str, how: Callable[[Bucket], Bucket | None]) -> bool:
        """Read, change and write the item, again if another shard wrote in between; `how`
        returns None when there is nothing to change. False if the item is gone or stays contended."""
        for _ in range(_WRITE_TRIES):
            bucket = self.load(pk)
            if bucket is None:
                return False
            new = how(bucket)
            if new is None:
                return True
            if self.save(pk, new):
                return True
        return False


def _decimal(value: float) -> Decimal:
    return Decimal(repr(round(value, 6)))


@dataclass(frozen=True, slots=True)
class Ticket:
    """What `take` let through: the model (the limiter key) and the tokens it was charged."""

    model: str
    tokens: int = 0


class _Local:
    """One limiter key as one shard sees it: the unspent rest of its lease (`tokens` may be a
    debt), and the rates it knows."""

    def __init__(self, pk: str) -> None:
        self.pk = pk
        self.requests = 0
        self.tokens = 0.0
        self.rate: float | None = None
        self.token_rate = 0.0
        self.paused_until = 0.0
        # what a request of this key has cost lately, in estimated tokens (a moving average)
        self.cost = 0.0
        self.off = False
        self.probing = False
        self.learned = asyncio.Event()
        self.lock = asyncio.Lock()


class SharedLimit:
    """What the engine draws from before each attempt: `take` waits for a leased request,
    `observe` learns and follows the limits from answers and drains on a spent quota, `settle`
    corrects a request's token estimate, `close` gives back what is unspent. DynamoDB calls run
    on a thread, off the event loop."""

    def __init__(
        self,
        table: BucketTable,
        *,
        base_url: str,
        api_key: str,
        lessee: str,
        policy: LeasePolicy | None = None,
        seeds: Mapping[str, RateSeed] | None = None,
        default_seed: RateSeed | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.table = table
        self._base_url = base_url
        self._api_key = api_key
        self.lessee = lessee
        self.policy = policy or LeasePolicy()
        self._seeds = dict(seeds or {})
        self._default_seed = default_seed
        self._clock = clock
        self._sleep = sleep
        self._keys: dict[str, _Local] = {}
        self._writes: set[asyncio.Task[Any]] = set()
        self.waited_s = 0.0

    def _local(self, model: str) -> _Local:
        local = self._keys.get(model)
        if local is None:
            local = self._keys[model] = _Local(limit_key(self._base_url, self._api_key, model))
        return local

    def seed_for(self, model: str) -> RateSeed | None:
        """The configured limits of `model`: the environment's, else the job's."""
        seed = self._seeds.get(model) or self._default_seed
        return seed if seed is not None and seed.rpm > 0 else None

    async def take(self, req: Request) -> Ticket:
        """Wait until `req` may be sent; returns the ticket to pass to `observe` and `settle`."""
        body = _parsed(req)
        model = str(body["model"]) if body is not None and isinstance(body.get("model"), str) else ""
        cost = estimate_tokens(body, req.path) if body is not None else 0
        local = self._local(model)
        local.cost = cost if local.cost == 0 else local.cost + (cost - local.cost) * _COST_WEIGHT
        while True:
            if local.off:
                return Ticket(model)
            wait = local.paused_until - self._clock()
            if wait > 0:
                self.waited_s += wait
                await self._sleep(wait)
                continue
            if local.requests > 0 and (local.token_rate <= 0 or local.tokens > 0):
                local.requests -= 1
                if local.token_rate <= 0:
                    return Ticket(model)
                local.tokens -= cost
                return Ticket(model, cost)
            if local.rate is None:
                if local.probing:
                    await self._wait_learned(local)
                    continue
                local.probing = True
                bucket = await asyncio.to_thread(self.table.load, local.pk)
                if bucket is None:
                    bucket = await asyncio.to_thread(self._seeded, model, local.pk)
                if bucket is None:
                    # nobody knows the rate yet: one request at a time until an answer tells it
                    return Ticket(model)
                self._know(local, bucket.rate, bucket.token_rate)
                local.probing = False
            async with local.lock:
                if local.requests == 0 or (local.token_rate > 0 and local.tokens <= 0):
                    await self._lease(local)

    def _seeded(self, model: str, pk: str) -> Bucket | None:
        """Create the item from the configured limits (if another shard just did, read its)."""
        seed = self.seed_for(model)
        if seed is None:
            return None
        rate, token_rate = seed.rpm / 60.0, seed.tpm / 60.0
        bucket = Bucket(rate=rate, level=0.0, stamp=self._clock(), version=1, token_rate=token_rate)
        bucket = replace(
            bucket,
            level=bucket.capacity(self.policy),
            token_level=bucket.token_capacity(self.policy) if token_rate else 0.0,
        )
        if self.table.save(pk, bucket):
            return bucket
        return self.table.load(pk)

    def _know(self, local: _Local, rate: float, token_rate: float) -> None:
        local.rate = rate
        local.token_rate = token_rate
        local.learned.set()

    async def _wait_learned(self, local: _Local) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(local.learned.wait(), timeout=1.0)

    async def _lease(self, local: _Local) -> None:
        while True:
            bucket = await asyncio.to_thread(self.table.load, local.pk)
            if bucket is None:
                # the item expired under us: learn the rate again
                local.rate = None
                local.learned.clear()
                return
            local.rate, local.token_rate = bucket.rate, bucket.token_rate
            grant = lease(
                bucket,
                self.lessee,
                self._clock(),
                self.policy,
                held=local.requests,
                held_tokens=local.tokens,
                tokens_per_request=local.cost,
            )
            if grant.bucket is None:
                self.waited_s += grant.wait_s
                await self._sleep(grant.wait_s)
                continue
            if await asyncio.to_thread(self.table.save, local.pk, grant.bucket):
                local.requests += grant.requests
                if bucket.token_rate > 0:
                    local.tokens += grant.tokens
                return

    def observe(self, ticket: Ticket, status: int | None, headers: Mapping[str, str] | None) -> None:
        """After an attempt sent past `take`: the first limit headers set the shared rates, later
        ones that differ change them, and a 429 that says the quota is spent drains the bucket."""
        local = self._local(ticket.model)
        if local.off:
            return
        if local.rate is None:
            self._learn(local, status, headers)
            return
        if headers is None:
            return
        if status == 429:
            self._on_throttled(local, ticket, headers)
        rate, token_rate = learned_rate(headers), learned_token_rate(headers)
        if _differs(rate, local.rate) or _differs(token_rate, local.token_rate):
            local.rate = rate or local.rate
            local.token_rate = token_rate or local.token_rate
            self._write_later(local.pk, lambda b: _follow(b, self._clock(), self.policy, rate, token_rate))

    def _learn(self, local: _Local, status: int | None, headers: Mapping[str, str] | None) -> None:
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
        token_rate = (learned_token_rate(headers) if headers is not None else None) or 0.0
        bucket = Bucket(rate=rate, level=0.0, stamp=self._clock(), version=1, token_rate=token_rate)
        bucket = replace(
            bucket,
            level=_remaining(headers, "requests", bucket.capacity(self.policy)),
            token_level=_remaining(headers, "tokens", bucket.token_capacity(self.policy)) if token_rate else 0.0,
        )
        self.table.save(local.pk, bucket)
        self._know(local, rate, token_rate)

    def _on_throttled(self, local: _Local, ticket: Ticket, headers: Mapping[str, str]) -> None:
        spent = _spent(headers, "requests", 1) or (ticket.tokens > 0 and _spent(headers, "tokens", ticket.tokens))
        if not spent:
            # a 429 with quota left (an overloaded server, a random fault) is this request's alone
            return
        now = self._clock()
        wait = retry_after_s(headers, now)
        if wait is None:
            reset = headers.get("x-ratelimit-reset-requests") or headers.get("x-ratelimit-reset-tokens")
            wait = (parse_reset_s(reset) if reset else None) or 1.0
        until = now + wait
        # what this shard holds was leased against a quota the provider says is gone
        local.requests = 0
        local.tokens = min(local.tokens, 0.0)
        if until <= local.paused_until:
            return
        local.paused_until = until
        self._write_later(local.pk, lambda b: drained(b, self._clock(), until) if b.paused_until < until else None)

    def settle(self, ticket: Ticket, body: Any) -> None:
        """The answer's usage replaces the request's token estimate in the shard's balance."""
        if ticket.tokens <= 0:
            return
        used = used_tokens(body)
        if used is not None:
            self._local(ticket.model).tokens += ticket.tokens - used

    def _write_later(self, pk: str, how: Callable[[Bucket], Bucket | None]) -> None:
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(self.table.change, pk, how))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def close(self) -> None:
        """Give back what this run leased and did not spend, and leave the shares: one write per
        model with something unspent."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        for local in self._keys.values():
            if local.off or local.rate is None or (local.requests <= 0 and local.tokens <= 0):
                continue
            requests, tokens = local.requests, local.tokens
            local.requests, local.tokens = 0, min(local.tokens, 0.0)
            await asyncio.to_thread(self.table.change, local.pk, self._returning(requests, tokens))

    def _returning(self, requests: int, tokens: float) -> Callable[[Bucket], Bucket | None]:
        def how(bucket: Bucket) -> Bucket:
            return give_back(bucket, self.lessee, self._clock(), self.policy, requests, tokens)

        return how


def _differs(heard: float | None, known: float) -> bool:
    return heard is not None and abs(heard - known) > _SAME_RATE * max(known, 1e-9)


def _follow(
    bucket: Bucket, now: float, policy: LeasePolicy, rate: float | None, token_rate: float | None
) -> Bucket | None:
    if not _differs(rate, bucket.rate) and not _differs(token_rate, bucket.token_rate):
        return None
    return retuned(bucket, now, policy, rate, token_rate)


def _spent(headers: Mapping[str, str], kind: str, need: float) -> bool:
    """Whether `x-ratelimit-remaining-<kind>` says less than `need` is left."""
    raw = headers.get(f"x-ratelimit-remaining-{kind}")
    if raw is None:
        return False
    try:
        return float(raw) < need
    except ValueError:
        return False


def _remaining(headers: Mapping[str, str] | None, kind: str, capacity: float) -> float:
    raw = headers.get(f"x-ratelimit-remaining-{kind}") if headers is not None else None
    try:
        return min(capacity, max(0.0, float(raw))) if raw is not None else capacity
    except ValueError:
        return capacity
