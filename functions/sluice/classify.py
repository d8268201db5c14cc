"""What one attempt's answer means: a result, another attempt after a delay, or a final error.

Pure: the engine hands over what came back (or how the connection was lost) and acts on the
verdict. The wall clock and the randomness of the jitter are passed in, so a test pins every
number, and the engine's loop holds no policy of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from .model import ErrorCode
from .retry import RetryPolicy, is_retryable, next_delay_s, should_retry

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
    # a 429 or a congestion code in the body: the caller's limiter backs off
    throttled: bool = False
    # a 5xx that is not throttling
    server_error: bool = False


def describe_lost(exc: BaseException) -> str:
    """The failure text of an attempt that got no complete answer (refused, reset, timed out)."""
    text = str(exc)
    return type(exc).__name__ + (": " + text[:EXCERPT] if text else "")


def provider_error(parsed: Any) -> tuple[str | None, str | None]:
    """(code, message) from an OpenAI-style error body; tolerant of every other shape."""
    if not isinstance(parsed, dict):
        return None, None
    error = parsed.get("error")
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        message = error.get("message")
        return (str(code) if code else None), (str(message) if message else None)
    if isinstance(error, str):
        return error, None
    code = parsed.get("code")
    message = parsed.get("message") or parsed.get("detail")
    return (str(code) if code else None), (str(message) if message else None)


def classify(
    status: int | None,
    headers: Mapping[str, str] | None,
    raw: bytes,
    lost: str | None,
    *,
    attempt: int,
    policy: RetryPolicy,
    now: float,
    rand: Callable[[], float],
) -> AttemptVerdict:
    """The verdict on attempt number `attempt` (counting from 1).

    `lost` describes a connection that failed before a whole answer arrived (`status` is then
    None); otherwise `status`, `headers` and `raw` are the answer. `now` is wall-clock epoch
    seconds, for a Retry-After given as an HTTP date.
    """
    if lost is not None:
        return _failed(None, None, lost, None, attempt, policy, headers, now, rand)
    assert status is not None
    if 200 <= status < 300:
        try:
            return AttemptVerdict(OK, orjson.loads(raw))
        except orjson.JSONDecodeError:
            # a mangled success is a transient fault, not an answer
            failure = f"HTTP {status} with a body that is not JSON: {raw[:EXCERPT]!r}"
            return _failed(None, None, failure, None, attempt, policy, headers, now, rand)
    parsed: Any
    try:
        parsed = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        parsed = raw.decode("utf-8", "replace")[:EXCERPT]
    body_code, message = provider_error(parsed)
    failure = f"HTTP {status}" + (f": {message}" if message else "")
    if body_code and (not message or body_code not in message):
        failure += f" ({body_code})"
    verdict = _failed(status, body_code, failure, parsed, attempt, policy, headers, now, rand)
    verdict.throttled = status == 429 or (body_code is not None and body_code in policy.retryable_body_codes)
    verdict.server_error = not verdict.throttled and status >= 500
    return verdict


def _failed(
    status: int | None,
    body_code: str | None,
    failure: str,
    body: Any,
    attempt: int,
    policy: RetryPolicy,
    headers: Mapping[str, str] | None,
    now: float,
    rand: Callable[[], float],
) -> AttemptVerdict:
    """Retry or give up; `status` None stands for a transient fault (lost connection, garbled body)."""
    if not should_retry(status, body_code, attempt, policy):
        if not is_retryable(status, body_code, policy):
            return AttemptVerdict(FAIL, body, failure, ErrorCode.PROVIDER_ERROR)
        return AttemptVerdict(
            FAIL, body, f"gave up after {attempt} attempts; last: {failure}", ErrorCode.RETRIES_EXHAUSTED
        )
    delay = next_delay_s(attempt, policy, headers, now, rand)
    if delay > policy.max_retry_after_s:
        message = (
            f"provider asked to wait {delay:.0f}s (more than {policy.max_retry_after_s:.0f}s) "
            f"after attempt {attempt}; last: {failure}"
        )
        return AttemptVerdict(FAIL, body, message, ErrorCode.RETRIES_EXHAUSTED)
    return AttemptVerdict(RETRY, body, failure, delay_s=delay)
