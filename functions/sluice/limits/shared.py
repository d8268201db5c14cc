"""One provider rate limit shared by every shard of every running job on the same key (issue 16).

A provider counts requests and tokens per (API key, model), whatever process sends them, so a
limit each shard keeps to itself lets N shards send N times the quota. The shared limit is
two token buckets, requests and tokens a second, in one item of the jobs table per limiter key:
`LIMIT#<hash of base URL and key>#<model>`. The buckets refill lazily by time: whoever reads the
item works out its levels from `level`, `token_level`, `stamp` and the rates, and a conditional
write (on `version`) takes a lease. `sluice.limits.lease` holds the arithmetic: fair shares among an
estimated number of lessees, leases taken into debt rather than waited for at the item, and the
surplus of a full bucket. The item stays about 1 KB, and its reads and writes a second follow the
key's rate, not the number of shards (issue 30).

A request goes while the shard's token balance is positive; one bigger than the balance leaves a
debt the next lease repays. The answer's usage settles the estimate in the shard's balance (no
write). What a request is estimated at, what an answer used and what its rate-limit headers say
are the provider's request format's to read (`sluice.providers`); `sluice.limits.answers` reads
them for the limit.

The rates: a seed (the environment's `rate_limits` for the model, else the job's `sluice-rpm` /
`sluice-tpm`) creates the item before any answer, so the first seconds do not overshoot. Without
one, a shard sends at its own concurrency until an answer's headers state the key's limits of
requests (and tokens) and set them, with the level the answer says remains (less what the shard
sent after that request): what the provider says remains is spent at once. Headers
win over a seed, and when they later report a different limit the item follows. A provider that
answers without such headers is not limited here, and neither are errors and timeouts: they say
nothing about the key's rate (issue 31).

A 429 whose headers say the quota is spent (nothing remains) drains the item and pauses
it until the provider's Retry-After: every shard stops leasing until then, rather than each
finding out alone. At the end of a run (done, or stopped for the Lambda's time) a shard gives
back what it holds unspent and leaves the shares, so a short shard strands no capacity.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from sluice.contract import RateSeed, causes
from sluice.contract.model import Request
from sluice.core.retry import table_retry_delay_s
from sluice.limits.answers import first_bucket, said_left, spent_until
from sluice.limits.lease import Bucket, Grant, LeasePolicy, differs, drained, followed, give_back, lease
from sluice.limits.local import Joining, LocalKey, chained, limit_key
from sluice.limits.table import OFF, OPEN, BucketTable
from sluice.providers import REQUESTS, TOKENS, ProviderError, RequestFormat

# limit_key is named here too: callers reach the limiter's key where they reach the limiter
__all__ = ["SharedLimit", "Ticket", "limit_key"]

# the weight of the newest request in a key's moving average of token costs
_COST_WEIGHT = 0.05
# the output a request that sets no limit on it is assumed to ask for, until its answer settles it.
# Smaller than the budget's reservation on purpose: this one only paces, and a guess too large
# would hold every shard below the quota it could use
DEFAULT_OUTPUT_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Ticket:
    """What `take` let through: the model (the limiter key) and the tokens it was charged; for a
    request sent before the rate was known, when it went."""

    model: str
    tokens: int = 0
    unpaced_at: float = 0.0


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
        request_format: RequestFormat,
        policy: LeasePolicy | None = None,
        seeds: Mapping[str, RateSeed] | None = None,
        default_seed: RateSeed | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        expected: int | None = None,
    ) -> None:
        self.table = table
        # the requests this run will send at most, when it knows (a collect run's polls): its leases
        # are no larger, so it has nothing to give back at the end
        self._expected = expected
        self._taken = 0
        self._base_url = base_url
        self._api_key = api_key
        self.lessee = lessee
        self.format = request_format
        self.policy = policy or LeasePolicy()
        self._seeds = dict(seeds or {})
        self._default_seed = default_seed
        self._clock = clock
        self._sleep = sleep
        self._rand = rand
        self._keys: dict[str, LocalKey] = {}
        self._writes: set[asyncio.Task[Any]] = set()
        self.waited_s = 0.0

    def _local(self, model: str) -> LocalKey:
        local = self._keys.get(model)
        if local is None:
            local = self._keys[model] = LocalKey(limit_key(self._base_url, self._api_key, model))
        return local

    def seed_for(self, model: str) -> RateSeed | None:
        """The configured limits of `model`: the environment's, else the job's."""
        seed = self._seeds.get(model) or self._default_seed
        return seed if seed is not None and seed.rpm > 0 else None

    async def take(self, req: Request) -> Ticket:
        """Wait until `req` may be sent; returns the ticket to pass to `observe` and `settle`."""
        body = _parsed_body(req)
        model = self.format.model(body) if body is not None else ""
        cost = (
            self.format.estimate_tokens(body, req.path, default_output=DEFAULT_OUTPUT_TOKENS) if body is not None else 0
        )
        local = self._local(model)
        local.cost = cost if local.cost == 0 else local.cost + (cost - local.cost) * _COST_WEIGHT
        local.waiting += 1
        try:
            return await self._take(local, model, cost)
        finally:
            local.waiting -= 1

    async def _take(self, local: LocalKey, model: str, cost: int) -> Ticket:
        while True:
            if local.off:
                return Ticket(model)
            if local.rate is None:
                if local.joining is not None:
                    await asyncio.shield(local.joining)
                    continue
                now = self._clock()
                if now < local.look_at:
                    # nobody knows the rate yet: the shard's own concurrency until an answer tells it
                    local.unpaced.append((now, cost))
                    # counted against the run's expected requests: a lease after learning asks
                    # only for the rest, so the run has nothing to give back
                    self._taken += 1
                    return Ticket(model, unpaced_at=now)
                async with local.lock:
                    if local.rate is None and local.joining is None and self._clock() >= local.look_at:
                        await self._look(local, model)
                continue
            wait = max(local.paused_until, local.ready_at) - self._clock()
            if wait > 0:
                self.waited_s += wait
                await self._sleep(wait)
                continue
            if local.requests > 0 and not _short_of_tokens(local, cost):
                local.requests -= 1
                self._taken += 1
                if local.token_rate <= 0:
                    return Ticket(model)
                local.tokens -= cost
                return Ticket(model, cost)
            async with local.lock:
                if local.requests == 0 or _short_of_tokens(local, cost):
                    await self._lease(local)

    async def _look(self, local: LocalKey, model: str) -> None:
        """Find the key's item, or create it from the configured limits. Without either, the first
        shard to look learns the rate, sending at its own concurrency, while the others wait for
        it: a wave of every shard's requests before anyone knows the rate would overshoot it."""
        policy = self.policy
        poll = policy.learn_poll_s
        waited: float | None = None
        # a run's first look is its own; a look again after sending unpaced, or after a wait for
        # the learner, is a poll of the item at the period it waited
        if local.look_every > 0:
            waited = local.look_every
        while True:
            looking = causes.because(causes.LOOK_AGAIN, period_s=waited) if waited is not None else None
            with looking or causes.because(causes.LOOK):
                done = await self._look_once(local, model)
            if done is not None:
                if done:
                    return
                break
            waited = poll * (0.5 + 0.5 * self._rand())
            self.waited_s += waited
            await self._sleep(waited)
            poll = min(policy.learn_poll_max_s, 2 * poll)
        # send unpaced, and look for the item again later
        local.look_every = min(policy.look_again_max_s, max(policy.look_again_s, 2 * local.look_every))
        local.look_at = self._clock() + local.look_every

    async def _look_once(self, local: LocalKey, model: str) -> bool | None:
        """One look at the key's item: True when the rate is known (or off), False when this run
        sends unpaced (it learns, or the learner let everyone go), None to wait for the learner."""
        policy = self.policy
        now = self._clock()
        found = await asyncio.to_thread(self.table.look, local.pk)
        if found is None:
            with causes.because(causes.FIRST):
                found = await asyncio.to_thread(self._seeded, model, local.pk)
        if found is None:
            with causes.because(causes.FIRST):
                claimed = await asyncio.to_thread(self.table.claim, local.pk, now)
            if claimed:
                local.learner = True
                return False
            # another shard claimed it first: look again, at once
            with causes.because(causes.RACE):
                return await self._look_once(local, model)
        if isinstance(found, Bucket):
            if local.unpaced:
                # another shard learned the rate while this one sent unpaced
                how = Joining(local, self._clock, policy)
                with causes.because(causes.FIRST):
                    await asyncio.to_thread(self.table.change, local.pk, how)
                local.unpaced.clear()
            self._know(local, found)
            return True
        if found.state == OFF:
            local.off = True
            return True
        if now - found.since >= policy.learn_wait_max_s:
            # the learner is gone, or its answers take this long: learn anew
            with causes.because(causes.FIRST):
                claimed = await asyncio.to_thread(self.table.claim, local.pk, now, found)
            if claimed:
                local.learner = True
                return False
            # another shard claimed it first: look again, at once
            with causes.because(causes.RACE):
                return await self._look_once(local, model)
        if found.state == OPEN:
            return False
        return None

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

    def _know(self, local: LocalKey, bucket: Bucket) -> None:
        local.rate = bucket.rate
        local.token_rate = bucket.token_rate
        local.window_s = bucket.window_s

    async def _lease(self, local: LocalKey) -> None:
        """Top the shard's balance up once its period is over, or bite the bucket's surplus
        before then; a lost write is tried again after a jittered wait."""
        tries = 0
        while True:
            now = self._clock()
            if local.until > now and not local.more:
                # the shard had its share of this period: nothing to ask the item for until its end
                self.waited_s += local.until - now
                await self._sleep(local.until - now)
                continue
            # a look at the item is one cause and the write of what it grants another: a look
            # that finds nothing to grant waits for the period's end and writes nothing
            period_s, every = self.policy.min_period_s, self.policy.min_requests
            with causes.because(causes.RACE) if tries else causes.because(causes.LEASE, period_s=period_s, every=every):
                bucket = await asyncio.to_thread(self.table.load, local.pk)
            if bucket is None:
                # the item expired under us: learn the rate again
                local.rate = None
                local.look_at = local.look_every = 0.0
                return
            self._know(local, bucket)
            grant = self._grant(local, bucket)
            if grant.bucket is None:
                local.more = False
                tries = 0
                continue
            with (
                causes.because(causes.RACE)
                if tries
                else causes.because(causes.LEASE_TAKEN, period_s=period_s, every=every)
            ):
                saved = await asyncio.to_thread(self.table.save, local.pk, grant.bucket)
            if saved:
                self._granted(local, grant, bucket)
                return
            tries += 1
            await self._sleep(table_retry_delay_s(tries, self._rand))

    def _grant(self, local: LocalKey, bucket: Bucket) -> Grant:
        return lease(
            bucket,
            self.lessee,
            self._clock(),
            self.policy,
            held=local.requests,
            held_tokens=local.tokens,
            tokens_per_request=local.cost,
            own_until=local.until,
            demand=local.waiting,
            most=self._most(),
        )

    def _granted(self, local: LocalKey, grant: Grant, bucket: Bucket) -> None:
        """The shard's balance, once the item took `grant` (leased from `bucket`)."""
        local.requests += grant.requests
        if bucket.token_rate > 0:
            local.tokens += grant.tokens
        local.ready_at = max(local.ready_at, self._clock() + grant.wait_s)
        local.until = grant.until
        local.seat_until = grant.until + self.policy.idle_s
        local.more = grant.more

    def _most(self) -> int | None:
        """The requests this run will still ask for, while it knows (retries past its count: not)."""
        if self._expected is None or self._taken >= self._expected:
            return None
        return self._expected - self._taken

    def observe(
        self, ticket: Ticket, status: int | None, headers: Mapping[str, str] | None, said: ProviderError | None = None
    ) -> None:
        """After an attempt sent past `take`: the first limit headers set the shared rates, later
        ones that differ change them, and a 429 that says the quota is spent drains the bucket.
        `said`: what a 429's body says, for a family that says there how long the quota is spent
        (Gemini's `RESOURCE_EXHAUSTED` with its `retryDelay`), its headers saying nothing."""
        local = self._local(ticket.model)
        if local.off:
            return
        if local.rate is None:
            self._learn(local, ticket, status, headers)
            return
        if headers is None:
            return
        # one write for all this answer changes: two at once from one shard would race each other
        changes: list[Callable[[Bucket], Bucket | None]] = []
        until = self._on_throttled(local, ticket, headers, said) if status == 429 else None
        if until is not None:
            policy = self.policy
            changes.append(lambda b: drained(b, self._clock(), until, policy) if b.paused_until < until else None)
        limits = self.format.rate_limits(headers)
        rate, token_rate = limits.requests_per_s, limits.tokens_per_s
        window = self.policy.headroom_s if rate is not None and local.window_s < self.policy.headroom_s else None
        if differs(rate, local.rate) or differs(token_rate, local.token_rate) or window:
            local.rate = rate or local.rate
            local.token_rate = token_rate or local.token_rate
            local.window_s = window or local.window_s
            left = (
                (said_left(self.format, headers, REQUESTS), said_left(self.format, headers, TOKENS))
                if window
                else (None, None)
            )
            changes.append(lambda b: followed(b, self._clock(), self.policy, rate, token_rate, window, left))
        if changes:
            with causes.because(causes.THROTTLED):
                self._write_later(functools.partial(self.table.change, local.pk, chained(changes)))

    def _learn(self, local: LocalKey, ticket: Ticket, status: int | None, headers: Mapping[str, str] | None) -> None:
        if local.joining is not None:
            return
        limits = self.format.rate_limits(headers) if headers is not None else None
        rate = limits.requests_per_s if limits is not None else None
        if limits is None or rate is None:
            if status is not None and status < 400:
                # answered without a rate header: this provider tells nothing to share
                local.off = True
                with causes.because(causes.FIRST):
                    self._write_later(functools.partial(self.table.mark, local.pk, OFF))
            elif local.learner and not local.opened:
                # an error or a timeout says nothing about the rate: the others need not wait for it
                local.opened = True
                with causes.because(causes.FIRST):
                    self._write_later(functools.partial(self.table.mark, local.pk, OPEN))
            return
        # what the answer says remains does not count the requests this shard sent after it
        unpaced = local.unpaced_since(ticket.unpaced_at)
        bucket = first_bucket(self.format, self.policy, limits, headers, now=self._clock(), unpaced=unpaced)
        with causes.because(causes.FIRST):
            local.joining = asyncio.get_running_loop().create_task(self._join(local, bucket))
        self._writes.add(local.joining)

    async def _join(self, local: LocalKey, bucket: Bucket) -> None:
        """Make the key's item from what the first answer with rate headers said; when another
        shard made it first, debit what this one sent unpaced since, within what its answer says
        remains. When requests of this shard wait for the rate, or a run that knows its count has
        more to send, their lease is in the same write: the item's first moment is one write fewer
        (claim, make, lease were three at once)."""
        try:
            # leased from the item as it would be before its first write, so the write is its first
            wanted = local.waiting > 0 or (self._most() or 0) > 0
            grant = self._grant(local, replace(bucket, version=bucket.version - 1)) if wanted else None
            made = grant.bucket if grant is not None and grant.bucket is not None else bucket
            if not await asyncio.to_thread(self.table.save, local.pk, made):
                how = Joining(local, self._clock, self.policy, (bucket.level, bucket.token_level))
                await asyncio.to_thread(self.table.change, local.pk, how)
            elif grant is not None and made is not bucket:
                self._granted(local, grant, bucket)
            local.unpaced.clear()
            self._know(local, bucket)
        finally:
            local.joining = None

    def _on_throttled(
        self, local: LocalKey, ticket: Ticket, headers: Mapping[str, str], said: ProviderError | None
    ) -> float | None:
        """When the bucket must pause until, if the 429 says the quota is spent and this shard
        has not paused it that long already."""
        until = spent_until(self.format, headers, said, tokens=ticket.tokens, now=self._clock())
        if until is None:
            return None
        # what this shard holds was leased against a quota the provider says is gone
        local.requests = 0
        local.tokens = min(local.tokens, 0.0)
        if until <= local.paused_until:
            return None
        local.paused_until = until
        if until <= local.paused_written + self.policy.pause_slack_s:
            # the answers to a wave of requests each say a reset a little later: one write for them
            return None
        local.paused_written = until
        return until

    def settle(self, ticket: Ticket, body: Any) -> None:
        """The answer's usage replaces the request's token estimate in the shard's balance."""
        if ticket.tokens <= 0:
            return
        used = self.format.counted_tokens(body)
        if used is not None:
            self._local(ticket.model).tokens += ticket.tokens - used

    def _write_later(self, write: Callable[[], object]) -> None:
        """`write` (to the item) on a thread, without waiting for it; `close` waits."""
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(write))
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
            with causes.because(causes.GIVE_BACK):
                returning = self._returning(requests, tokens, local.seat_until)
                await asyncio.to_thread(self.table.change, local.pk, returning)

    def _returning(self, requests: int, tokens: float, seat_until: float) -> Callable[[Bucket], Bucket | None]:
        def how(bucket: Bucket) -> Bucket:
            return give_back(bucket, self.lessee, self._clock(), self.policy, requests, tokens, seat_until=seat_until)

        return how


def _short_of_tokens(local: LocalKey, cost: int) -> bool:
    """The key has a token limit, the request is estimated at some (a poll is not), and the balance
    is spent."""
    return local.token_rate > 0 and cost > 0 and local.tokens <= 0


def _parsed_body(req: Request) -> dict[str, Any] | None:
    if req.body:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError:
            return None
        if isinstance(body, dict):
            return body
    return None
