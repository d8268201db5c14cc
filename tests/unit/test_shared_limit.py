"""The shared rate limit's arithmetic: the bucket, its leases and seats, its tokens, its pauses and
what is given back, and the limiter's key (`limit_fakes` holds what the limit's tests share)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sluice.limits.lease import SEATS, Bucket, drained, give_back, lease, refill, retuned, seat_of
from sluice.limits.shared import limit_key

from tests.unit.limit_fakes import POLICY, seated


def seating(until: dict[str, float]) -> tuple[float, ...]:
    """The seats of lessees that count until the given times (their period's end plus `idle_s`)."""
    seats = [0.0] * SEATS
    for name, when in until.items():
        assert seats[seat_of(name)] == 0.0, "two of the test's lessees share a seat"
        seats[seat_of(name)] = when
    return tuple(seats)


def test_refill_grows_with_time_up_to_capacity() -> None:
    bucket = Bucket(rate=20.0, level=0.0, stamp=100.0)
    assert refill(bucket, 100.0, POLICY) == 0.0
    assert refill(bucket, 101.5, POLICY) == pytest.approx(30.0)
    # capacity is burst_s of the rate
    assert refill(bucket, 1000.0, POLICY) == pytest.approx(200.0)
    # a clock that steps back never drains the bucket
    assert refill(Bucket(rate=20.0, level=5.0, stamp=100.0), 99.0, POLICY) == 5.0


def test_lone_lessee_leases_a_period_of_the_whole_rate() -> None:
    # 20 requests a second: 25 requests are 1.25 s, under the 2 s minimum period, so 40
    grant = lease(Bucket(rate=20.0, level=200.0, stamp=0.0), "a", 0.0, POLICY)
    assert grant.requests == 40
    assert grant.bucket is not None
    assert grant.bucket.level == pytest.approx(160.0)
    assert grant.until == 2.0 and grant.wait_s == 0.0
    # the lessee counts until its period is over and `idle_s` more
    assert seated(grant.bucket, 0.0) == {seat_of("a"): 7.0}
    assert grant.bucket.version == 1


def test_lessees_share_the_rate_and_wait_out_their_period() -> None:
    bucket = Bucket(rate=20.0, level=200.0, stamp=0.0, seats=seating({"a": 7.0, "b": 8.0, "c": 6.0}))
    grant = lease(bucket, "d", 0.5, POLICY)
    # four lessees (as the seats estimate them, within a percent): 5 a second each, 25 requests take 5 s
    assert grant.requests == 25
    assert grant.bucket is not None and grant.until == pytest.approx(5.5, rel=0.01)
    # the lessee keeps to its period itself: asked again before its end, there is nothing to take
    again = lease(grant.bucket, "d", 1.0, POLICY, own_until=grant.until)
    assert again.requests == 0 and again.bucket is None
    assert again.wait_s == pytest.approx(grant.until - 1.0)


def test_idle_lessees_stop_counting() -> None:
    bucket = Bucket(rate=20.0, level=200.0, stamp=0.0, seats=seating({"gone": 6.0, "b": 35.0}))
    grant = lease(bucket, "a", 10.0, POLICY)
    assert grant.bucket is not None
    assert set(seated(grant.bucket, 10.0)) == {seat_of("a"), seat_of("b")}
    assert grant.requests == 25


def test_a_short_bucket_leases_into_debt_and_says_when_the_lease_is_ready() -> None:
    grant = lease(Bucket(rate=20.0, level=10.0, stamp=0.0), "a", 0.0, POLICY)
    assert grant.requests == 40 and grant.bucket is not None
    # the lessee waits on its own for the refill, without asking the item again
    assert grant.wait_s == pytest.approx((40 - 10) / 20.0)
    assert grant.bucket.level == pytest.approx(-30.0)
    # its period starts when the lease is ready
    assert grant.until == pytest.approx(1.5 + 2.0)
    # the next lessee queues behind the debt: two lessees now, 25 requests each
    second = lease(grant.bucket, "b", 0.0, POLICY)
    assert second.requests == 25 and second.wait_s == pytest.approx((30 + 25) / 20.0)


def test_a_slow_rate_still_leases_one_request() -> None:
    grant = lease(Bucket(rate=0.05, level=1.0, stamp=0.0), "a", 0.0, POLICY)
    assert grant.requests == 1


def test_key_names_the_model_and_never_holds_the_api_key() -> None:
    api_key = "sk-proj-AbCdEf0123456789xyz"
    key = limit_key("https://api.openai.com/v1/", api_key, "gpt-4o-mini")
    assert key.startswith("LIMIT#") and key.endswith("#gpt-4o-mini")
    assert api_key not in key
    for start in range(len(api_key) - 5):
        assert api_key[start : start + 6] not in key
    assert key == limit_key("https://api.openai.com/v1", api_key, "gpt-4o-mini")
    assert key != limit_key("https://api.openai.com/v1", api_key + "2", "gpt-4o-mini")
    assert key != limit_key("https://other.example/v1", api_key, "gpt-4o-mini")
    assert key != limit_key("https://api.openai.com/v1", api_key, "gpt-4o")


def test_a_lease_takes_a_period_of_the_token_share_too() -> None:
    bucket = Bucket(rate=20.0, level=200.0, stamp=0.0, token_rate=1000.0, token_level=10_000.0)
    grant = lease(bucket, "a", 0.0, POLICY)
    assert grant.requests == 40 and grant.tokens == pytest.approx(2000.0)
    assert grant.bucket is not None and grant.bucket.token_level == pytest.approx(8000.0)
    # not enough tokens: ready once the token bucket has refilled the lease
    short = lease(replace(bucket, token_level=500.0), "a", 0.0, POLICY)
    assert short.bucket is not None and short.wait_s == pytest.approx(1.5)


def test_a_lease_tops_the_balance_up_and_a_debt_is_repaid() -> None:
    bucket = Bucket(rate=20.0, level=200.0, stamp=0.0, token_rate=1000.0, token_level=10_000.0)
    grant = lease(bucket, "a", 0.0, POLICY, held=30, held_tokens=-500.0)
    # requests the token share left unspent do not pile up: 40 is the share, 30 are held
    assert grant.requests == 10
    # a debt of 500 tokens is paid from this lease
    assert grant.tokens == pytest.approx(2500.0)


def test_a_token_bound_lessee_leases_min_requests_worth_of_tokens() -> None:
    bucket = Bucket(rate=200.0, level=2000.0, stamp=0.0, token_rate=100.0, token_level=1000.0)
    # 26 tokens a request at 100 tokens a second: 25 requests take 6.5 s of the token rate
    grant = lease(bucket, "a", 0.0, POLICY, tokens_per_request=26.0)
    assert grant.bucket is not None and grant.until == pytest.approx(6.5)
    assert grant.tokens == pytest.approx(650.0)


def test_a_paused_bucket_leases_nothing_ready_before_the_reset() -> None:
    bucket = drained(Bucket(rate=20.0, level=200.0, stamp=0.0), 4.0, 7.0, POLICY)
    grant = lease(bucket, "a", 5.0, POLICY)
    # the bucket refills from the reset: 40 requests are ready 2 s after it
    assert grant.requests == 40 and grant.wait_s == pytest.approx(2.0 + 2.0)
    assert lease(bucket, "a", 9.0, POLICY).wait_s == 0.0


def test_drained_empties_both_buckets_and_refills_from_the_429() -> None:
    bucket = drained(Bucket(rate=20.0, level=150.0, stamp=0.0, token_rate=100.0, token_level=900.0), 10.0, 13.0, POLICY)
    assert (bucket.level, bucket.token_level, bucket.paused_until) == (0.0, 0.0, 13.0)
    assert refill(bucket, 13.0, POLICY) == 0.0
    assert refill(bucket, 16.0, POLICY) == pytest.approx(60.0)
    # a debt owed by leases not ready yet stays owed
    assert drained(Bucket(rate=20.0, level=-40.0, stamp=10.0), 10.0, 13.0, POLICY).level == -40.0


def test_given_back_leases_return_to_the_bucket_and_the_lessee_leaves() -> None:
    seats = seating({"a": 14.0, "b": 14.0})
    bucket = Bucket(rate=20.0, level=100.0, stamp=0.0, version=4, seats=seats, token_rate=100.0, token_level=10.0)
    back = give_back(bucket, "a", 1.0, POLICY, 35, 300.0, seat_until=14.0)
    assert back.level == pytest.approx(100.0 + 20.0 + 35)
    assert back.token_level == pytest.approx(10.0 + 100.0 + 300.0)
    assert seated(back, 1.0) == {seat_of("b"): 14.0} and back.version == 5
    # never past capacity
    assert give_back(bucket, "a", 1.0, POLICY, 500, 0.0).level == pytest.approx(200.0)


def test_retuned_follows_the_new_limits_within_their_capacity() -> None:
    bucket = Bucket(rate=20.0, level=200.0, stamp=0.0, token_rate=100.0, token_level=1000.0)
    lower = retuned(bucket, 0.0, POLICY, 10.0, 50.0)
    assert (lower.rate, lower.token_rate) == (10.0, 50.0)
    assert (lower.level, lower.token_level) == (100.0, 500.0)
    assert retuned(bucket, 0.0, POLICY, 40.0, None).level == 200.0
    # a token limit heard of for the first time starts full, as the provider's does
    fresh = retuned(Bucket(rate=20.0, level=5.0, stamp=0.0), 0.0, POLICY, None, 100.0)
    assert fresh.token_level == pytest.approx(1000.0)
