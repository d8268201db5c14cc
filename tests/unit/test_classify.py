"""`classify`: what one attempt's answer means, with the clock and the jitter pinned."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
import pytest
from sluice.contract.model import ErrorCode
from sluice.core.retry import RetryPolicy
from sluice.providers import OPENAI, RequestFormat
from sluice.providers.openai import OpenAIFormat
from sluice.send.classify import FAIL, OK, RETRY, AttemptVerdict, classify, describe_lost

POLICY = RetryPolicy(max_attempts=3, base_delay_s=1.0, max_delay_s=30.0, max_retry_after_s=60.0)
NOW = 1_700_000_000.0


def verdict(
    status: int | None,
    body: bytes = b"",
    *,
    headers: Mapping[str, str] | None = None,
    lost: str | None = None,
    attempt: int = 1,
    request_format: RequestFormat = OPENAI,
) -> AttemptVerdict:
    return classify(
        status,
        headers,
        body,
        lost,
        attempt=attempt,
        policy=POLICY,
        request_format=request_format,
        now=NOW,
        rand=lambda: 0.5,
    )


def test_a_json_success_is_the_answer() -> None:
    v = verdict(200, b'{"id": "chatcmpl-1"}')
    assert (v.kind, v.body, v.throttled, v.server_error) == (OK, {"id": "chatcmpl-1"}, False, False)


def test_a_success_that_is_not_json_is_retried_as_a_transient_fault() -> None:
    v = verdict(200, b"<html>gateway</html>")
    assert v.kind == RETRY
    assert v.message.startswith("HTTP 200 with a body that is not JSON")
    assert v.delay_s == pytest.approx(0.5)  # full jitter, rand 0.5, base 1 s on attempt 1
    last = verdict(200, b"<html>gateway</html>", attempt=3)
    assert (last.kind, last.code) == (FAIL, ErrorCode.RETRIES_EXHAUSTED)
    assert last.message.startswith("gave up after 3 attempts; last: HTTP 200 with a body that is not JSON")


def test_a_client_error_fails_at_once_with_the_providers_words() -> None:
    body = orjson.dumps({"error": {"message": "bad model", "code": "model_not_found"}})
    v = verdict(400, body)
    assert (v.kind, v.code, v.message) == (FAIL, ErrorCode.PROVIDER_ERROR, "HTTP 400: bad model (model_not_found)")
    assert v.body == {"error": {"message": "bad model", "code": "model_not_found"}}
    assert not v.throttled and not v.server_error


def test_throttling_is_flagged_for_the_limiter_and_retried_no_sooner_than_asked() -> None:
    v = verdict(429, b"{}", headers={"retry-after": "7"})
    assert (v.kind, v.throttled, v.server_error, v.delay_s) == (RETRY, True, False, 7.0)
    # a congestion code in the body is throttling whatever the status
    queued = verdict(400, orjson.dumps({"error": {"code": "queue_wait_exceeded"}}))
    assert (queued.kind, queued.throttled) == (RETRY, True)


class _Overloading(OpenAIFormat):
    """A family that throttles with 529 and says so in its body's error type."""

    throttle_statuses = frozenset({429, 529})
    congestion_codes = frozenset({"overloaded_error"})


def test_which_statuses_and_codes_are_throttling_is_the_request_formats() -> None:
    overloaded = orjson.dumps({"error": {"type": "overloaded_error", "message": "Overloaded"}})
    plain = verdict(529, overloaded)
    assert (plain.kind, plain.throttled, plain.server_error) == (RETRY, False, True)
    theirs = verdict(529, overloaded, request_format=_Overloading())
    assert (theirs.kind, theirs.throttled, theirs.server_error) == (RETRY, True, False)
    # a congestion code is retried whatever the status, by the format that names it only
    refused = orjson.dumps({"error": {"type": "overloaded_error"}})
    assert verdict(400, refused).kind == FAIL
    assert (verdict(400, refused, request_format=_Overloading()).kind, verdict(400, refused).throttled) == (
        RETRY,
        False,
    )


def test_a_server_error_is_retried_until_the_attempts_run_out() -> None:
    v = verdict(503, b"Service Unavailable", attempt=2)
    assert (v.kind, v.server_error, v.throttled, v.body) == (RETRY, True, False, "Service Unavailable")
    assert v.delay_s == pytest.approx(1.0)  # rand 0.5 of 2 s on attempt 2
    last = verdict(503, b"", attempt=3)
    assert (last.kind, last.code, last.message) == (
        FAIL,
        ErrorCode.RETRIES_EXHAUSTED,
        "gave up after 3 attempts; last: HTTP 503",
    )


def test_a_wait_longer_than_the_policy_allows_fails_with_the_reason() -> None:
    v = verdict(429, b"", headers={"retry-after": "3600"})
    assert (v.kind, v.code) == (FAIL, ErrorCode.RETRIES_EXHAUSTED)
    assert v.message == "provider asked to wait 3600s (more than 60s) after attempt 1; last: HTTP 429"


def test_a_lost_connection_is_retried_and_keeps_its_description() -> None:
    lost = describe_lost(ConnectionResetError("Connection reset by peer"))
    assert lost == "ConnectionResetError: Connection reset by peer"
    v = verdict(None, lost=lost)
    assert (v.kind, v.message, v.body) == (RETRY, lost, None)
    assert not v.server_error and not v.throttled
    assert verdict(None, lost=describe_lost(TimeoutError()), attempt=3).message == (
        "gave up after 3 attempts; last: TimeoutError"
    )
