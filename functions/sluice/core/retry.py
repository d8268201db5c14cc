"""When to retry a provider call and how long to wait first.

Pure functions over a frozen policy so the engine, the background poller and the tests
all agree on the same numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime


def _default_statuses() -> frozenset[int]:
    return frozenset({408, 409, 429, *range(500, 600)})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 6
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    request_timeout_s: float = 120.0
    # A Retry-After longer than this is treated as "gone for good": sleeping through it would
    # outlive the Lambda, so the line goes to errors with the reason instead.
    max_retry_after_s: float = 300.0
    retryable_statuses: frozenset[int] = field(default_factory=_default_statuses)
    # A request at a processing tier that trades speed for price (OpenAI's flex) may wait this long
    # for its answer: OpenAI's advice for flex is 15 minutes, where a standard answer gets
    # `request_timeout_s`.
    tier_timeout_s: float = 900.0
    # After this many answers that the tier has no capacity now (OpenAI's 429 `resource_unavailable`),
    # a request goes on at the standard tier: OpenAI's own advice, and a line that waited out more
    # would spend its attempts, and the deadline's time, on a tier that is not there today.
    tier_fallback_after: int = 2


DEFAULT_POLICY = RetryPolicy()


def is_retryable(status: int | None, congested: bool, policy: RetryPolicy) -> bool:
    """Whether another attempt could succeed, attempts left aside. `congested`: the answer says the
    provider is throttling or congested (a status or body code its request format counts as such),
    whatever its status."""
    if status is None:
        # connection refused/reset, timeout, truncated body: the request may never have landed
        return True
    if 200 <= status < 300:
        return False
    if status in policy.retryable_statuses:
        return True
    return congested


def tier_timeout_s(policy: RetryPolicy, time_left_s: float) -> float:
    """How long one attempt at a slow tier may wait: `tier_timeout_s`, cut to the time the run has
    left (`time_left_s`: a Lambda ends, and the answer with it), never under the standard
    `request_timeout_s`, which the run keeps in hand when it stops taking requests."""
    return max(policy.request_timeout_s, min(policy.tier_timeout_s, time_left_s))


def falls_back(unavailable: int, policy: RetryPolicy) -> bool:
    """Whether a request whose tier said `unavailable` times that it has no capacity goes on at
    the standard tier."""
    return unavailable >= policy.tier_fallback_after


def should_retry(
    status: int | None,
    congested: bool,
    attempt: int,
    policy: RetryPolicy,
) -> bool:
    """`attempt` is how many attempts have been made, counting the one that just failed."""
    return attempt < policy.max_attempts and is_retryable(status, congested, policy)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    # plain dicts (tests, other clients) are case-sensitive; aiohttp's CIMultiDict is not
    for key, v in headers.items():
        if key.lower() == name:
            return v
    return None


def _finite_non_negative(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


_SECONDS = re.compile(r"^(?:\d+(?:\.\d*)?|\.\d+)$")


def retry_after_s(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the provider asked us to wait, or None if it did not say (or said nonsense).

    `now` is wall-clock epoch seconds, only needed for the HTTP-date form.
    """
    ms = _header(headers, "retry-after-ms")
    if ms is not None:
        value = _finite_non_negative(ms.strip())
        if value is not None:
            return value / 1000.0
    raw = _header(headers, "retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    if not raw:
        return None
    if _SECONDS.match(raw):
        return _finite_non_negative(raw)
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # RFC 9110 dates are always GMT; a naive parse means the zone was omitted
        return None
    return max(0.0, when.timestamp() - now)


def backoff_s(attempt: int, policy: RetryPolicy, rand: Callable[[], float], *, floor: float = 0.0) -> float:
    """Jittered exponential backoff: uniform in [floor * c, c], c = min(cap, base * 2**(attempt-1)).

    Full jitter (`floor=0`) by default because thousands of workers hit by the same outage
    must not come back in lockstep.
    """
    exponent = min(max(attempt - 1, 0), 62)
    ceiling = min(policy.max_delay_s, policy.base_delay_s * float(2**exponent))
    return ceiling * (floor + (1 - floor) * rand())


# A conditional write to a table item that lost the race to another shard's, or the part of a
# batched call DynamoDB left unprocessed, goes again after this backoff: full jitter, so shards
# that collided once do not collide again in step.
TABLE_RETRY = RetryPolicy(base_delay_s=0.02, max_delay_s=1.0)


def table_retry_delay_s(attempt: int, rand: Callable[[], float]) -> float:
    """How long to wait before trying a table write again, `attempt` lost so far (1 = the first)."""
    return backoff_s(attempt, TABLE_RETRY, rand)


def next_delay_s(
    attempt: int,
    policy: RetryPolicy,
    headers: Mapping[str, str] | None,
    now: float,
    rand: Callable[[], float],
    *,
    asked_s: float | None = None,
) -> float:
    """How long to sleep before the next attempt.

    The jittered backoff is capped at `max_delay_s`; a Retry-After is a floor we never go
    under, even when it is above the cap (the provider knows its own queue). Taking the max
    of the two keeps backing off when a provider keeps saying "1s" and keeps refusing.
    `asked_s`: the wait an error body asked for (Gemini's `RetryInfo.retryDelay`), where the
    headers say none.
    """
    jittered = backoff_s(attempt, policy, rand)
    hinted = retry_after_s(headers, now) if headers else None
    if hinted is None:
        hinted = asked_s
    if hinted is None:
        return jittered
    return max(hinted, jittered)


# How many times a line is sent when the user set no --max-attempts (issue 61). A shard's first
# pass gives each line FIRST_PASS_ATTEMPTS; a line they all fail on transient causes waits for the
# shard's last sweep, which goes in rounds of SWEEP_ROUND_ATTEMPTS while a line has fewer than
# `line_attempts` of the shard's faults call for.
FIRST_PASS_ATTEMPTS = 3
SWEEP_ROUND_ATTEMPTS = 3
# Under random faults at rate p, a line of k attempts ends in errors with chance p**k: the sweep
# gives it attempts until that is below this, 0.01 lines a million. At p = 0.15 (10% 429s and 5%
# 500s) that is 10 attempts (0.15**10 = 5.8e-9), at 0.3 it is 16, at 0.4 it is 21.
LINE_ERROR_TARGET = 1e-8
# however often the faults come: past this, most attempts fail and waiting is the provider's cure,
# not sending again (at p = 0.4, 0.4**22 = 1.8e-9)
LINE_ATTEMPTS_CEILING = 22
# the last sweep starts no round this long after its first began: what bounds a shard's retrying
SWEEP_MAX_S = 300.0


def fault_rate(failed: int, attempts: int) -> float:
    """The chance an attempt fails, from `failed` of `attempts` seen; one failure and one success
    assumed besides, so that a shard with few lines does not read as fault-free."""
    return (failed + 1) / (attempts + 2)


def line_attempts(failed: int, attempts: int) -> int:
    """How many times a line is sent before it ends in errors, the user having set no cap: enough that
    under random faults at the rate seen (`fault_rate`) it would fail every one with chance below
    LINE_ERROR_TARGET. A line that fails where most succeed is the one a small rate ends soon (at
    1 failed attempt in 100, four attempts reach the target): it is not unlucky, it is refused."""
    rate = fault_rate(failed, attempts)
    needed = math.ceil(math.log(LINE_ERROR_TARGET) / math.log(rate))
    return min(LINE_ATTEMPTS_CEILING, max(FIRST_PASS_ATTEMPTS + SWEEP_ROUND_ATTEMPTS, needed))


def first_pass_attempts(cap: int) -> int:
    """A line's attempts in its shard's first pass; `cap`: the user's --max-attempts, 0 for none.
    With a cap, the first pass has the larger half and the sweep the rest."""
    return cap - cap // 2 if cap else FIRST_PASS_ATTEMPTS


def sweep_round_attempts(given: int, cap: int, needed: int) -> int:
    """Attempts the sweep's next round gives each line still failing, `given` each so far; 0: none.
    A cap's sweep is one round of what the cap leaves; else rounds of SWEEP_ROUND_ATTEMPTS up to
    `needed` (`line_attempts`)."""
    if cap:
        return max(0, cap - given)
    return max(0, min(SWEEP_ROUND_ATTEMPTS, needed - given))


def unswept_attempts(cap: int) -> int:
    """A line's attempts where no sweep follows (a background shard's sends again of invalid answers)."""
    return cap or FIRST_PASS_ATTEMPTS + SWEEP_ROUND_ATTEMPTS
