"""What one lease takes from a provider key's shared bucket: pure arithmetic over the item's state.

The item must stay small and cool whatever the number of shards drawing on it (issue 30): it
holds no entry per lessee, only a fixed array of `SEATS` seats, each the time until which the
lessees whose name hashes to it count toward the shares. The number of lessees is estimated from
the seats still live by linear counting (Whang, Vander-Zanden and Taylor, "A linear-time
probabilistic counting algorithm for database applications", 1990): within about 8% at a thousand
lessees (a standard error; 3% at a hundred), and never more than `SEATS * ln(2 * SEATS)` (about
2,000). Each lessee keeps the end of its own period itself and does not come back before it.

A lease never waits at the item: when the bucket is short, the lessee takes its share into debt
(the level goes below zero) and the grant says when the debt is repaid; the lessee sleeps until
then without reading the item again. Every lease is one read and one write, and a lease is at
least `min_requests` requests (or the whole bucket when that is smaller), so the item's reads and
writes a second stay under a small multiple of the key's rate / `min_requests`, however many
lessees wait. A 429 that says the quota is spent moves the bucket's `stamp` into the future:
nothing refills, and no lease is ready, before the provider's reset.

The bucket holds `window_s` of the rate: `burst_s` when the limits came from a seed, a minute
(`headroom_s`) when they came from the provider's headers, whose own bucket holds a minute's worth
and whose remaining-requests and -tokens headers said how full it was. Whatever the bucket holds beyond the
leases is surplus: a lessee whose workers wait may take a bite of it besides its share (its part
of the surplus, about one request per waiting worker), so a full provider bucket is spent at once
rather than paced from zero, and a share a lessee leaves unused goes to those that can use it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

# a limit header within this share of the known rate is the same limit (no write)
SAME_RATE = 0.01
# the seats of a bucket: 2 bytes each, so the whole item stays under 1 KB (one write unit a write,
# where 1,025 bytes cost two) whatever the number of lessees, with room for a long model name
SEATS = 320
# a seat holds whole seconds past the item's `seats_at`, up to this (about 18 hours)
SEAT_MAX_S = 65_535


@dataclass(frozen=True)
class LeasePolicy:
    # a lease is at least this many requests, so writes per line stay at or under 1/min_requests
    min_requests: int = 25
    # ... and at least this long a period
    min_period_s: float = 2.0
    # ... and long enough that all the lessees' leases write the item at most this often. A lease
    # reads the item and writes it back on condition, some 10 ms apart: at 40 a second, 0.4 other
    # leases fall in a lease's window on average, so a lost race stays the exception (at 500 a
    # second, 1,000 shards leasing every 2 s, every lease would race five others and the item would
    # serve about 100). 1,000 shards lease every 25 s; up to 80 the 2 s minimum holds.
    item_leases_per_s: float = 40.0
    # a seeded bucket holds this many seconds of the rate
    burst_s: float = 10.0
    # a bucket learned from the provider's headers holds this many: OpenAI's limits are a minute's
    headroom_s: float = 60.0
    # a lessee whose period ended this long ago no longer counts toward the shares
    idle_s: float = 5.0
    # a 429 whose reset is at most this much later than the pause the shard last wrote moves only
    # the shard's own pause, not the item's: the item's is at most this much early
    pause_slack_s: float = 1.0
    # a conditional write lost to another lessee is tried again after `retry.table_retry_delay_s`,
    # up to this many times for a change that can wait (a lease keeps trying)
    write_tries: int = 8
    # While a shard learns the key's rate from its first answers, the others look at the item
    # again after a jittered wait from `learn_poll_s`, doubling to `learn_poll_max_s`, and send
    # unpaced once it has learned nothing for `learn_wait_max_s` (or its answers carried no rate)
    learn_poll_s: float = 0.05
    learn_poll_max_s: float = 1.0
    learn_wait_max_s: float = 10.0
    # a lessee that sends unpaced looks for the item again after this long, twice as long each
    # time up to the maximum: a shard's answers may have made it meanwhile
    look_again_s: float = 0.25
    look_again_max_s: float = 60.0


@dataclass(frozen=True)
class Bucket:
    """The item's state. `seats` are `SEATS` times (epoch seconds, 0 for none) until which the
    lessees seated there count; a `token_rate` of 0 means no token limit is known; `stamp` later
    than now means the bucket is paused until then (`paused_until`: when a 429 said the quota
    refills); a level below zero is the debt of leases not ready yet; `window_s` 0 is `burst_s`."""

    rate: float  # requests a second
    level: float
    stamp: float
    version: int = 0
    seats: tuple[float, ...] = ()
    token_rate: float = 0.0  # tokens a second
    token_level: float = 0.0
    paused_until: float = 0.0
    window_s: float = 0.0
    # when the level was set from what an answer said remains (epoch seconds; 0: from a seed)
    since: float = 0.0

    def capacity(self, policy: LeasePolicy) -> float:
        return max(1.0, self.rate * (self.window_s or policy.burst_s))

    def token_capacity(self, policy: LeasePolicy) -> float:
        return max(1.0, self.token_rate * (self.window_s or policy.burst_s))


@dataclass(frozen=True)
class Grant:
    """With the bucket to write back: `requests` and `tokens` taken (either may be 0 when the
    lessee already holds its share), ready to send in `wait_s`; `until` is the end of the
    lessee's period, and `more` says the bucket still holds surplus worth a bite before then.
    Without a bucket: nothing to take, ask again in `wait_s` (at the end of the lessee's period)."""

    requests: int
    wait_s: float
    bucket: Bucket | None = None
    tokens: float = 0.0
    until: float = 0.0
    more: bool = False


def seat_of(lessee: str) -> int:
    """The lessee's seat: the same in every process, so its next lease finds it again."""
    return int.from_bytes(hashlib.blake2b(lessee.encode(), digest_size=4).digest(), "big") % SEATS


def lessees(seats: Sequence[float], now: float) -> float:
    """How many lessees the live seats stand for (linear counting); 0 when none is live."""
    live = sum(1 for until in seats if until > now)
    if live == 0:
        return 0.0
    empty = len(seats) - live
    # every seat taken: the estimate's ceiling. Rounded to a hundredth, finer than the estimate
    # is good for, so that one lessee alone is 1, not 1.001
    return round(len(seats) * math.log(len(seats) / max(empty, 0.5)), 2)


def _seats(bucket: Bucket) -> list[float]:
    return list(bucket.seats) if len(bucket.seats) == SEATS else [0.0] * SEATS


def refill(bucket: Bucket, now: float, policy: LeasePolicy) -> float:
    """The level at `now`: what was left plus the rate times the time since, up to capacity."""
    elapsed = max(0.0, now - bucket.stamp)
    return min(bucket.capacity(policy), bucket.level + elapsed * bucket.rate)


def refill_tokens(bucket: Bucket, now: float, policy: LeasePolicy) -> float:
    elapsed = max(0.0, now - bucket.stamp)
    return min(bucket.token_capacity(policy), bucket.token_level + elapsed * bucket.token_rate)


def lease_period_s(policy: LeasePolicy, lessees: float, share: float) -> float:
    """How long a lessee's lease lasts: at least `min_period_s`, long enough for `min_requests` at
    its `share` (requests a second), and long enough that `lessees` write the item no more than
    `item_leases_per_s` times a second together."""
    return max(policy.min_period_s, policy.min_requests / share, lessees / policy.item_leases_per_s)


def lease(
    bucket: Bucket,
    lessee: str,
    now: float,
    policy: LeasePolicy,
    *,
    held: int = 0,
    held_tokens: float = 0.0,
    tokens_per_request: float = 0.0,
    own_until: float = 0.0,
    demand: int = 0,
    most: int | None = None,
) -> Grant:
    """What `lessee`, holding `held` requests and `held_tokens` unspent, may take at `now`.

    Once its period (`own_until`) is over: its balance topped up to one period of its fair share,
    ready when the bucket has refilled that much. The period is long enough for `min_requests`
    of either share: of requests, and of tokens at `tokens_per_request` each (what the lessee's
    requests have cost so far), so a token-bound lessee writes no more often. At any time, with
    `demand` workers waiting: a bite of the bucket's surplus, at most `demand` requests. A lessee
    that will ask for at most `most` (1 or more) requests more (a run that knows its count) takes
    no more: what it would give back unspent is a write of the item saved.

    Longer than 80 lines on purpose: one pure computation of a grant from one reading of the
    bucket, whose steps share the lessee count, the share and the period; split, each part
    would take and return most of them."""
    seats = _seats(bucket)
    seat = seat_of(lessee)
    start = max(now, bucket.stamp)
    steady = own_until <= now
    counted = seats.copy()
    counted[seat] = max(counted[seat], start + policy.idle_s)
    count = max(1.0, lessees(counted, now))
    share = bucket.rate / count
    period = lease_period_s(policy, count, share)
    if bucket.token_rate > 0 and tokens_per_request > 0:
        # no longer than the token bucket holds of the share, or the lease would be cut to
        # capacity and the period would starve the lessee
        token_period = policy.min_requests * tokens_per_request * count / bucket.token_rate
        period = max(period, min(token_period, policy.burst_s * count))
    want = max(1, min(math.floor(share * period), math.floor(bucket.capacity(policy))))
    if most is not None and most < want:
        # a period as long as the smaller lease lasts at the share: a retry past the count waits no longer
        period *= most / want
        want = most
    take = max(0, want - held) if steady else 0
    level = refill(bucket, now, policy)
    take_tokens = token_level = 0.0
    if bucket.token_rate > 0:
        capacity = bucket.token_capacity(policy)
        want_tokens = min(capacity, bucket.token_rate / count * period)
        if most is not None:
            want_tokens = min(want_tokens, want * tokens_per_request)
        # a debt (negative balance) is repaid from this lease, up to the bucket's capacity
        take_tokens = max(0.0, min(capacity, want_tokens - held_tokens)) if steady else 0.0
        token_level = refill_tokens(bucket, now, policy)
    room = _room(bucket, level - take, token_level - take_tokens, tokens_per_request)
    # its part of the surplus, for the workers its balance leaves waiting, and a lease's worth at
    # least (a bite is worth its write); what it does not take stays for the shares' leases
    smallest = min(policy.min_requests, want)
    waiting = demand - held - take
    bite = math.floor(min(max(waiting, smallest), room / count)) if waiting > 0 else 0
    if most is not None:
        bite = min(bite, max(0, most - held - take))
    if bite < smallest:
        bite = 0
    if not steady and bite == 0:
        return Grant(0, own_until - now)
    bite_tokens = bite * tokens_per_request if bucket.token_rate > 0 else 0.0
    level -= take + bite
    token_level -= take_tokens + bite_tokens
    debt_s = max(0.0, -level / bucket.rate)
    if bucket.token_rate > 0:
        debt_s = max(debt_s, -token_level / bucket.token_rate)
    ready = start + debt_s
    until = ready + period if steady else own_until
    seats[seat] = max(seats[seat], until + policy.idle_s)
    taken = replace(
        bucket,
        level=level,
        token_level=token_level,
        stamp=start,
        version=bucket.version + 1,
        seats=tuple(s if s > now else 0.0 for s in seats),
    )
    more = _room(bucket, level, token_level, tokens_per_request) >= policy.min_requests
    return Grant(take + bite, ready - now, taken, take_tokens + bite_tokens, until, more)


def _room(bucket: Bucket, level: float, token_level: float, tokens_per_request: float) -> float:
    """The bucket's surplus, in requests: what it holds beyond the leases taken."""
    room = level
    if bucket.token_rate > 0 and tokens_per_request > 0:
        room = min(room, token_level / tokens_per_request)
    return max(0.0, room)


def give_back(
    bucket: Bucket,
    lessee: str,
    now: float,
    policy: LeasePolicy,
    requests: int,
    tokens: float,
    *,
    seat_until: float = 0.0,
) -> Bucket:
    """The bucket with what `lessee` leased and did not spend returned, and its seat emptied
    unless a later lessee seated there holds it (`seat_until`: what the lessee's last lease set)."""
    seats = _seats(bucket)
    seat = seat_of(lessee)
    # a seat is stored in whole seconds, rounded up
    if seats[seat] <= seat_until + 1.0:
        seats[seat] = 0.0
    token_level = refill_tokens(bucket, now, policy) if bucket.token_rate > 0 else 0.0
    return replace(
        bucket,
        level=min(bucket.capacity(policy), refill(bucket, now, policy) + max(0, requests)),
        token_level=min(bucket.token_capacity(policy), token_level + max(0.0, tokens)) if bucket.token_rate else 0.0,
        stamp=max(now, bucket.stamp),
        version=bucket.version + 1,
        seats=tuple(s if s > now else 0.0 for s in seats),
    )


def drained(bucket: Bucket, now: float, until: float, policy: LeasePolicy) -> Bucket:
    """The bucket after the provider said the quota is spent until `until`: empty (a debt stays
    owed), and refilling from `until` only."""
    token_level = min(0.0, refill_tokens(bucket, now, policy)) if bucket.token_rate > 0 else 0.0
    return replace(
        bucket,
        level=min(0.0, refill(bucket, now, policy)),
        token_level=token_level,
        stamp=max(until, bucket.stamp),
        version=bucket.version + 1,
        paused_until=until,
    )


def joined(
    bucket: Bucket,
    now: float,
    policy: LeasePolicy,
    unpaced: tuple[int, float],
    remaining: tuple[float, float] | None = None,
) -> Bucket | None:
    """The bucket once a lessee that sent requests before it knew of it joins: the `unpaced`
    requests and tokens it sent since the level was set are not in it, and it holds no more than
    what the lessee's first answer said `remaining` (requests, tokens), if it had one. Each bound
    can only be above the truth (a request in transit as the level was set; a lease not sent yet
    when the answer was), so the lower is the better. None when nothing changes."""
    requests = refill(bucket, now, policy) - unpaced[0]
    tokens = refill_tokens(bucket, now, policy) - unpaced[1] if bucket.token_rate > 0 else 0.0
    if remaining is not None:
        requests = min(requests, remaining[0])
        tokens = min(tokens, remaining[1]) if bucket.token_rate > 0 else 0.0
    if requests >= refill(bucket, now, policy) and (
        bucket.token_rate <= 0 or tokens >= refill_tokens(bucket, now, policy)
    ):
        return None
    return replace(bucket, level=requests, token_level=tokens, stamp=max(now, bucket.stamp), version=bucket.version + 1)


def retuned(
    bucket: Bucket,
    now: float,
    policy: LeasePolicy,
    rate: float | None,
    token_rate: float | None,
    *,
    window_s: float | None = None,
    remaining: tuple[float | None, float | None] = (None, None),
) -> Bucket:
    """The bucket following limits the provider now reports; levels kept, within the new capacities.

    A bucket a seed made holds `burst_s` of the rate; widened to the provider's window, it is
    raised to what the answer says `remaining` (requests, tokens), less a lease a lessee may hold
    unsent (the answer does not count those), so that the provider's headroom is spent."""
    new = replace(
        bucket,
        rate=rate or bucket.rate,
        token_rate=token_rate or bucket.token_rate,
        window_s=window_s or bucket.window_s,
        level=refill(bucket, now, policy),
        token_level=refill_tokens(bucket, now, policy) if bucket.token_rate > 0 else 0.0,
        stamp=max(now, bucket.stamp),
        version=bucket.version + 1,
    )
    if bucket.token_rate <= 0 < new.token_rate:
        # a token limit heard of for the first time: the provider's bucket starts full
        new = replace(new, token_level=new.token_capacity(policy))
    if window_s is not None:
        count = max(1.0, lessees(bucket.seats, now))
        held = max(count * policy.min_requests, new.rate * policy.min_period_s)
        if remaining[0] is not None:
            new = replace(new, level=max(new.level, remaining[0] - held))
        if remaining[1] is not None and new.token_rate > 0:
            new = replace(new, token_level=max(new.token_level, remaining[1] - held * new.token_rate / new.rate))
    return replace(
        new,
        level=min(new.level, new.capacity(policy)),
        token_level=min(new.token_level, new.token_capacity(policy)) if new.token_rate else 0.0,
    )


def differs(heard: float | None, known: float) -> bool:
    """Whether a rate the provider reports is another than the one known."""
    return heard is not None and abs(heard - known) > SAME_RATE * max(known, 1e-9)


def followed(
    bucket: Bucket,
    now: float,
    policy: LeasePolicy,
    rate: float | None,
    token_rate: float | None,
    window_s: float | None,
    left: tuple[float | None, float | None],
) -> Bucket | None:
    """The bucket following the limits an answer reports (and the provider's window, with what
    it says is `left`), or None when they are the ones it has."""
    wider = window_s is not None and bucket.window_s < window_s
    if not differs(rate, bucket.rate) and not differs(token_rate, bucket.token_rate) and not wider:
        return None
    if not wider:
        return retuned(bucket, now, policy, rate, token_rate)
    return retuned(bucket, now, policy, rate, token_rate, window_s=window_s, remaining=left)
