from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sluice.core.retry import (
    DEFAULT_POLICY,
    FIRST_PASS_ATTEMPTS,
    LINE_ATTEMPTS_CEILING,
    LINE_ERROR_TARGET,
    RetryPolicy,
    backoff_s,
    fault_rate,
    first_pass_attempts,
    is_retryable,
    line_attempts,
    next_delay_s,
    retry_after_s,
    should_retry,
    sweep_round_attempts,
    unswept_attempts,
)

NOW = 1_800_000_000.0


def http_date(offset_s: float) -> str:
    return format_datetime(datetime.fromtimestamp(NOW + offset_s, tz=UTC), usegmt=True)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"retry-after-ms": "250"}, 0.25),
        ({"Retry-After-Ms": "1500.5"}, 1.5005),
        ({"retry-after": "3"}, 3.0),
        ({"Retry-After": "3"}, 3.0),
        ({"Retry-After": " 2.5 "}, 2.5),
        ({"Retry-After": "0"}, 0.0),
        ({"Retry-After": ".5"}, 0.5),
        # the millisecond form wins when both are present
        ({"retry-after-ms": "100", "retry-after": "7"}, 0.1),
        # a broken millisecond header falls back to the standard one
        ({"retry-after-ms": "soon", "retry-after": "7"}, 7.0),
        ({"retry-after-ms": "-5"}, None),
        ({"Retry-After": http_date(42)}, 42.0),
        ({"Retry-After": http_date(-60)}, 0.0),
        ({"Retry-After": "tomorrow"}, None),
        ({"Retry-After": ""}, None),
        ({"Retry-After": "-3"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Retry-After": "inf"}, None),
        ({"Retry-After": "1e3"}, None),
        ({"Retry-After": "Wed, 99 Foo 2026 25:61:00"}, None),
    ],
)
def test_retry_after_forms(headers: dict[str, str], expected: float | None) -> None:
    got = retry_after_s(headers, NOW)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-6)


def test_retry_after_reads_aiohttp_headers() -> None:
    from multidict import CIMultiDict, CIMultiDictProxy

    headers = CIMultiDictProxy(CIMultiDict({"Retry-After-MS": "40"}))
    assert retry_after_s(headers, NOW) == pytest.approx(0.04)


@pytest.mark.parametrize(
    ("status", "congested", "attempt", "expected"),
    [
        (None, False, 1, True),
        (408, False, 1, True),
        (409, False, 1, True),
        (429, False, 1, True),
        (500, False, 1, True),
        (502, False, 5, True),
        (503, False, 6, False),
        (599, False, 1, True),
        (429, False, 6, False),
        (None, False, 6, False),
        (200, False, 1, False),
        (400, False, 1, False),
        (401, False, 1, False),
        (404, False, 1, False),
        (422, False, 1, False),
        # an answer the request format reads as congestion is retried whatever its status
        (400, True, 1, True),
        (503, True, 1, True),
        (400, True, 6, False),
    ],
)
def test_should_retry_table(status: int | None, congested: bool, attempt: int, expected: bool) -> None:
    assert should_retry(status, congested, attempt, DEFAULT_POLICY) is expected


def test_retryable_ignores_budget() -> None:
    assert is_retryable(429, False, DEFAULT_POLICY)
    assert not is_retryable(400, False, DEFAULT_POLICY)


def test_policy_defaults() -> None:
    p = RetryPolicy()
    assert (p.max_attempts, p.base_delay_s, p.max_delay_s, p.request_timeout_s) == (6, 0.5, 30, 120)
    assert {408, 409, 429, 500, 599} <= p.retryable_statuses
    assert 600 not in p.retryable_statuses and 499 not in p.retryable_statuses


@pytest.mark.parametrize(
    ("attempt", "ceiling"),
    [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (6, 16.0), (7, 30.0), (50, 30.0), (10_000, 30.0)],
)
def test_backoff_ceiling_is_exponential_and_capped(attempt: int, ceiling: float) -> None:
    assert backoff_s(attempt, DEFAULT_POLICY, lambda: 1.0) == pytest.approx(ceiling)
    assert backoff_s(attempt, DEFAULT_POLICY, lambda: 0.0) == 0.0


@given(st.integers(min_value=1, max_value=200), st.floats(min_value=0, max_value=0.999999))
def test_full_jitter_bounds(attempt: int, r: float) -> None:
    delay = backoff_s(attempt, DEFAULT_POLICY, lambda: r)
    assert 0.0 <= delay <= DEFAULT_POLICY.max_delay_s
    assert delay <= DEFAULT_POLICY.base_delay_s * 2 ** (attempt - 1)


def test_batch_create_waits_at_least_half_of_each_step() -> None:
    """Creating a batch backs off with equal jitter through the same formula as the engine."""
    from sluice.providers.batch import CREATE_JITTER_FLOOR
    from sluice.providers.openai.batch import CREATE_POLICY

    assert CREATE_POLICY.max_attempts == 5
    waits = [
        (
            backoff_s(n, CREATE_POLICY, lambda: 0.0, floor=CREATE_JITTER_FLOOR),
            backoff_s(n, CREATE_POLICY, lambda: 1.0, floor=CREATE_JITTER_FLOOR),
        )
        for n in range(1, CREATE_POLICY.max_attempts)
    ]
    assert waits == [(0.5, 1.0), (1.0, 2.0), (2.0, 4.0), (4.0, 8.0)]
    assert backoff_s(3, CREATE_POLICY, lambda: 0.5, floor=CREATE_JITTER_FLOOR) == 3.0


@pytest.mark.parametrize(
    ("attempt", "headers", "r", "expected"),
    [
        # no hint: jittered backoff
        (1, {}, 0.5, 0.25),
        (1, None, 1.0, 0.5),
        # hint above the jitter: exactly the hint
        (1, {"retry-after-ms": "1200"}, 1.0, 1.2),
        (1, {"Retry-After": "1"}, 0.0, 1.0),
        # hint below a grown backoff: keep backing off
        (5, {"Retry-After": "1"}, 1.0, 8.0),
        # hint above the cap is still honoured in full
        (1, {"Retry-After": "90"}, 1.0, 90.0),
        # garbage hint: plain backoff
        (3, {"Retry-After": "later"}, 1.0, 2.0),
    ],
)
def test_next_delay(attempt: int, headers: dict[str, str] | None, r: float, expected: float) -> None:
    assert next_delay_s(attempt, DEFAULT_POLICY, headers, NOW, lambda: r) == pytest.approx(expected)


@given(
    st.integers(min_value=1, max_value=30),
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=0, max_value=1000, allow_nan=False),
)
def test_next_delay_never_under_hint(attempt: int, r: float, hint: float) -> None:
    delay = next_delay_s(attempt, DEFAULT_POLICY, {"retry-after-ms": str(hint * 1000)}, NOW, lambda: r)
    assert delay >= hint - 1e-9
    assert delay <= max(hint, DEFAULT_POLICY.max_delay_s) + 1e-9


@pytest.mark.parametrize(
    ("failed", "attempts", "expected"),
    # 15% of attempts failing: 10 attempts (0.15**10 = 5.8e-9 a line); a rare failure: the
    # first pass and one round, six; most attempts failing: the ceiling
    [(150, 1000, 10), (1500, 10000, 10), (300, 1000, 16), (1, 100, 6), (0, 1, 17), (900, 1000, LINE_ATTEMPTS_CEILING)],
)
def test_a_lines_attempts_follow_from_the_faults_seen(failed: int, attempts: int, expected: int) -> None:
    assert line_attempts(failed, attempts) == expected


def test_under_random_faults_at_the_rate_seen_a_line_ends_in_errors_less_than_once_in_100_million() -> None:
    for rate in (0.01, 0.05, 0.15, 0.3, 0.4):
        failed, attempts = int(rate * 100_000), 100_000
        assert fault_rate(failed, attempts) ** line_attempts(failed, attempts) < LINE_ERROR_TARGET == 1e-8


@pytest.mark.parametrize(
    ("sent", "cap", "needed", "expected"),
    [(3, 0, 10, 3), (6, 0, 10, 3), (9, 0, 10, 1), (10, 0, 10, 0), (3, 6, 22, 3), (6, 6, 22, 0), (1, 1, 22, 0)],
)
def test_a_sweep_round_gives_what_the_cap_leaves_or_rounds_of_three_up_to_the_need(
    sent: int, cap: int, needed: int, expected: int
) -> None:
    assert sweep_round_attempts(sent, cap, needed) == expected


def test_without_a_cap_the_first_pass_gives_three_and_a_line_with_no_sweep_six() -> None:
    assert (first_pass_attempts(0), first_pass_attempts(6), first_pass_attempts(7)) == (FIRST_PASS_ATTEMPTS, 3, 4)
    assert (unswept_attempts(0), unswept_attempts(2)) == (6, 2)
