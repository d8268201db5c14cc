"""What one attempt's answer means: a result, another attempt after a delay, or a final error.

Pure: the engine hands over what came back (or how the connection was lost) and acts on the
verdict. The wall clock and the randomness of the jitter are passed in, so a test pins every
number, and the engine's loop holds no policy of its own. What an error body says, and which
statuses and codes mean the provider is throttling, are the provider's request format's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from sluice.contract.model import ErrorCode
from sluice.core.retry import RetryPolicy, is_retryable, next_delay_s, should_retry
from sluice.providers import ProviderError, RequestFormat

EXCERPT = 300

OK: Final = "ok"
RETRY: Final = "retry"
FAIL: Final = "fail"


@dataclass(slots=True)
class AttemptVerdict:
    """What one attempt's answer means for its request: done (OK), try again (RETRY) or give up (FAIL)."""

    kind: str
    # the answer's JSON (a result or an error body), or an excerpt of a body that is not JSON
    body: Any = None
    # why the attempt failed; for FAIL, the message the error line carries
    message: str = ""
    # FAIL only: the error code of the line
    code: str | None = None
    # RETRY only: how long to wait before the next attempt
    delay_s: float = 0.0
    # a throttling status (429) or a congestion code in the body: the caller's limiter backs off
    throttled: bool = False
    # a 5xx that is not throttling
    server_error: bool = False
    # the answer of a request sent at a tier (`Request.tier`): the tier has no capacity now, or the
    # model does not take it (`RequestFormat.tier_unavailable`, `tier_refused`)
    tier_unavailable: bool = False
    tier_refused: bool = False


def describe_lost(exc: BaseException) -> str:
    """The failure text of an attempt that got no complete answer (refused, reset, timed out)."""
    text = str(exc)
    return type(exc).__name__ + (": " + text[:EXCERPT] if text else "")


def throttle_said(status: int | None, raw: bytes, request_format: RequestFormat) -> ProviderError | None:
    """What a 429's body says (a family may say there how long the key's quota is spent, as
    Gemini's RetryInfo does); None for any other answer, whose body is not read here."""
    if status != 429:
        return None
    try:
        parsed = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None
    return request_format.error(parsed)


def classify(
    status: int | None,
    headers: Mapping[str, str] | None,
    raw: bytes,
    lost: str | None,
    *,
    attempt: int,
    policy: RetryPolicy,
    request_format: RequestFormat,
    now: float,
    rand: Callable[[], float],
) -> AttemptVerdict:
    """The verdict on attempt number `attempt` (counting from 1).

    `lost` describes a connection that failed before a whole answer arrived (`status` is then
    None); otherwise `status`, `headers` and `raw` are the answer. `now` is wall-clock epoch
    seconds, for a Retry-After given as an HTTP date.
    """
    if lost is not None:
        return _failed(None, False, lost, None, attempt, policy, headers, now, rand)
    assert status is not None
    if 200 <= status < 300:
        try:
            return AttemptVerdict(OK, orjson.loads(raw))
        except orjson.JSONDecodeError:
            # a mangled success is a transient fault, not an answer
            failure = f"HTTP {status} with a body that is not JSON: {raw[:EXCERPT]!r}"
            return _failed(None, False, failure, None, attempt, policy, headers, now, rand)
    parsed: Any
    try:
        parsed = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        parsed = raw.decode("utf-8", "replace")[:EXCERPT]
    said = request_format.error(parsed, headers)
    body_code, message = said.code, said.message
    failure = f"HTTP {status}" + (f": {message}" if message else "")
    if body_code and (not message or body_code not in message):
        failure += f" ({body_code})"
    # a tier out of capacity is no sign of the key's rate: the limiter keeps its pace for the
    # requests that go on at the standard tier
    unavailable = request_format.tier_unavailable(status, parsed)
    congested = not unavailable and (
        status in request_format.throttle_statuses
        or (body_code is not None and body_code in request_format.congestion_codes)
    )
    verdict = _failed(status, congested, failure, parsed, attempt, policy, headers, now, rand, said.retry_after_s)
    verdict.throttled = congested
    verdict.server_error = not congested and status >= 500
    verdict.tier_unavailable = unavailable
    verdict.tier_refused = request_format.tier_refused(status, parsed)
    return verdict


def _failed(
    status: int | None,
    congested: bool,
    failure: str,
    body: Any,
    attempt: int,
    policy: RetryPolicy,
    headers: Mapping[str, str] | None,
    now: float,
    rand: Callable[[], float],
    asked_s: float | None = None,
) -> AttemptVerdict:
    """Retry or give up; `status` None stands for a transient fault (lost connection, garbled body).
    `asked_s`: the wait the error body asked for (`ProviderError.retry_after_s`)."""
    if not should_retry(status, congested, attempt, policy):
        if not is_retryable(status, congested, policy):
            return AttemptVerdict(FAIL, body, failure, ErrorCode.PROVIDER_ERROR)
        return AttemptVerdict(
            FAIL, body, f"gave up after {attempt} attempts; last: {failure}", ErrorCode.RETRIES_EXHAUSTED
        )
    delay = next_delay_s(attempt, policy, headers, now, rand, asked_s=asked_s)
    if delay > policy.max_retry_after_s:
        message = (
            f"provider asked to wait {delay:.0f}s (more than {policy.max_retry_after_s:.0f}s) "
            f"after attempt {attempt}; last: {failure}"
        )
        return AttemptVerdict(FAIL, body, message, ErrorCode.RETRIES_EXHAUSTED)
    return AttemptVerdict(RETRY, body, failure, delay_s=delay)
