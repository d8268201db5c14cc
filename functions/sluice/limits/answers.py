"""What an answer tells the shared limit (`sluice.limits.shared`), read through the provider's
request format: what its rate-limit headers say is left, when a 429 says the key's quota is spent
and until when, and the key's first item made from the first answer that states its limits.
Pure: the limit's state and its table stay in `shared`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from sluice.core.retry import retry_after_s
from sluice.limits.lease import Bucket, LeasePolicy
from sluice.providers import REQUESTS, TOKENS, ProviderError, RateKind, RateLimits, RequestFormat


def spent(fmt: RequestFormat, headers: Mapping[str, str], kind: RateKind, need: float) -> bool:
    """Whether the answer's headers say less than `need` of the key's `kind` limit is left."""
    left = fmt.left(headers, kind)
    return left is not None and left < need


def remaining(fmt: RequestFormat, headers: Mapping[str, str] | None, kind: RateKind, capacity: float) -> float:
    """What the answer's headers say is left of `kind`, within `capacity` (all of it if they say nothing)."""
    left = fmt.left(headers, kind) if headers is not None else None
    return capacity if left is None else min(capacity, max(0.0, left))


def said_left(fmt: RequestFormat, headers: Mapping[str, str], kind: RateKind) -> float | None:
    """What the answer's headers say is left of `kind`, None when they say nothing readable."""
    left = remaining(fmt, headers, kind, math.inf)
    return left if math.isfinite(left) else None


def spent_until(
    fmt: RequestFormat, headers: Mapping[str, str], said: ProviderError | None, *, tokens: int, now: float
) -> float | None:
    """Until when a 429 says the key's quota is spent; None when it is this request's alone (an
    overloaded server, a random fault). `tokens`: what the request was charged (0: not counted)."""
    # a body that names the key's congestion and asks for a wait says the quota is spent for it
    asked = said.retry_after_s if said is not None and said.code in fmt.congestion_codes else None
    if asked is None and not (spent(fmt, headers, REQUESTS, 1) or (tokens > 0 and spent(fmt, headers, TOKENS, tokens))):
        return None
    wait = retry_after_s(headers, now)
    if wait is None:
        wait = asked
    if wait is None:
        wait = fmt.reset_s(headers, REQUESTS, now) or fmt.reset_s(headers, TOKENS, now) or 1.0
    return now + wait


def first_bucket(
    fmt: RequestFormat,
    policy: LeasePolicy,
    limits: RateLimits,
    headers: Mapping[str, str] | None,
    *,
    now: float,
    unpaced: tuple[int, float],
) -> Bucket:
    """The key's item as the first answer that states its limits makes it: at its rates, at the
    level the answer says remains less what the shard sent after that request (`unpaced`: the
    requests, the request included, and their tokens, sent since it went)."""
    rate = limits.requests_per_s or 0.0
    token_rate = limits.tokens_per_s or 0.0
    bucket = Bucket(
        rate=rate, level=0.0, stamp=now, version=1, token_rate=token_rate, window_s=policy.headroom_s, since=now
    )
    requests, tokens = unpaced
    after = max(0, requests - 1)
    return replace(
        bucket,
        level=remaining(fmt, headers, REQUESTS, bucket.capacity(policy)) - after,
        token_level=(
            remaining(fmt, headers, TOKENS, bucket.token_capacity(policy)) - tokens * after / max(1, requests)
            if token_rate
            else 0.0
        ),
    )
