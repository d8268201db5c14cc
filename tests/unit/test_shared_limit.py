"""The shared rate limit: the bucket's arithmetic, its key, and two shards drawing from one moto table."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.contract import RateSeed
from sluice.contract.model import Request
from sluice.limits.lease import SEATS, Bucket, LeasePolicy, drained, give_back, lease, refill, retuned, seat_of
from sluice.limits.shared import DEFAULT_OUTPUT_TOKENS, SharedLimit, Ticket, limit_key
from sluice.limits.table import BucketTable
from sluice.providers import OPENAI

from sluice_local.cloud import create_table
from sluice_local.moto_patches import consistent

POLICY = LeasePolicy(min_requests=25, min_period_s=2.0, burst_s=10.0, idle_s=5.0)


def seating(until: dict[str, float]) -> tuple[float, ...]:
    """The seats of lessees that count until the given times (their period's end plus `idle_s`)."""
    seats = [0.0] * SEATS
    for name, when in until.items():
        assert seats[seat_of(name)] == 0.0, "two of the test's lessees share a seat"
        seats[seat_of(name)] = when
    return tuple(seats)


def seated(bucket: Bucket, now: float) -> dict[int, float]:
    """The live seats of a bucket, by seat."""
    return {index: until for index, until in enumerate(bucket.seats) if until > now}


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


@pytest.fixture
def table() -> Iterator[Any]:
    # DynamoDB's single-item atomicity, as the local cloud has it: moto's conditional updates
    # from two threads may both pass
    with mock_aws(), consistent():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        yield boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")


def _request(n: int) -> Request:
    return Request(n, f"r{n}", "POST", "/v1/chat/completions", b'{"model":"gpt-4o-mini"}')


def test_two_shards_drawing_at_once_never_exceed_the_bucket(table: Any) -> None:
    """Two shards, each on its own thread and event loop as in the local cloud, take as fast as
    they can: over any stretch, what they took together fits the bucket's burst plus its refill."""
    rate = 10.0
    policy = LeasePolicy(min_requests=3, min_period_s=0.2, burst_s=1.0, idle_s=1.0)
    headers = {"x-ratelimit-limit-requests": str(int(rate * 60)), "x-ratelimit-remaining-requests": "10"}
    taken: dict[str, list[float]] = {"job-a#0": [], "job-b#0": []}
    shared = {
        lessee: SharedLimit(
            BucketTable(table),
            base_url="http://p/v1",
            api_key="sk-x",
            lessee=lessee,
            request_format=OPENAI,
            policy=policy,
        )
        for lessee in taken
    }
    window_s = 2.0
    stop = time.monotonic() + window_s

    async def draw(lessee: str) -> None:
        limit = shared[lessee]
        n = 0
        while time.monotonic() < stop:
            n += 1
            model = await limit.take(_request(n))
            if time.monotonic() < stop:
                taken[lessee].append(time.monotonic())
            # every answer carries the provider's headers, as OpenAI's do
            limit.observe(model, 200, headers)

    threads = [threading.Thread(target=asyncio.run, args=(draw(lessee),)) for lessee in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    stamps = sorted(t for times in taken.values() for t in times)
    capacity = rate * policy.burst_s
    # before the rate is known, the first shard's first request goes outside the bucket (the
    # other waits for its answer); one more for a clock tick's slack
    probes = len(taken)
    for i, first in enumerate(stamps):
        for j in range(i, len(stamps)):
            span = stamps[j] - first
            assert j - i + 1 <= capacity + rate * span + probes + 1e-9, (i, j, span)
    assert len(stamps) <= capacity + rate * window_s + probes
    # and the bucket was used, not just respected: both shards drew, each a fair part (at least
    # the burst: a loaded machine may not schedule the threads often enough for the refill too)
    assert len(stamps) >= capacity
    for times in taken.values():
        assert len(times) >= len(stamps) / 4
    # writes per line are measured by bench/limiter.py (0.04): here the two threads contend on
    # purpose, and each lost conditional write is one more, so their count depends on scheduling


# --- tokens a minute, seeds, changed limits, a spent quota, leases given back (issue 16) -------------


def _chat(n: int, content: str = "x" * 40, **extra: Any) -> Request:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **extra}
    return Request(n, f"r{n}", "POST", "/v1/chat/completions", orjson.dumps(body))


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


class FakeTime:
    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _limit(table: Any, lessee: str, at: FakeTime, **kwargs: Any) -> SharedLimit:
    return SharedLimit(
        BucketTable(table, clock=at.clock),
        base_url="http://p/v1",
        api_key="sk-x",
        lessee=lessee,
        request_format=OPENAI,
        policy=POLICY,
        clock=at.clock,
        sleep=at.sleep,
        **kwargs,
    )


def _item(table: Any) -> Bucket:
    bucket = BucketTable(table).load(limit_key("http://p/v1", "sk-x", "gpt-4o-mini"))
    assert bucket is not None
    return bucket


SEEDS = {"gpt-4o-mini": RateSeed(rpm=1200, tpm=60_000)}


def test_a_configured_limit_seeds_the_bucket_before_any_answer(table: Any) -> None:
    at = FakeTime()

    async def run() -> list[Ticket]:
        limit = _limit(table, "job#0", at, seeds=SEEDS, default_seed=RateSeed(rpm=60))
        return [await limit.take(_chat(n, max_tokens=16)) for n in range(3)]

    tickets = asyncio.run(run())
    # no probe: every request was leased from a bucket sized by the environment's figure
    bucket = _item(table)
    assert (bucket.rate, bucket.token_rate) == (pytest.approx(20.0), pytest.approx(1000.0))
    assert set(seated(bucket, at.now)) == {seat_of("job#0")}
    assert bucket.level == pytest.approx(200.0 - 40)
    assert [t.tokens for t in tickets] == [11 + 16] * 3


def test_a_request_that_caps_no_output_is_charged_the_pacing_guess_until_its_answer_settles(table: Any) -> None:
    at = FakeTime()

    async def run() -> tuple[Ticket, float]:
        limit = _limit(table, "job#0", at, seeds=SEEDS)
        ticket = await limit.take(_chat(1))
        before = limit._local("gpt-4o-mini").tokens
        limit.settle(ticket, {"usage": {"prompt_tokens": 11, "completion_tokens": 5}})
        return ticket, limit._local("gpt-4o-mini").tokens - before

    ticket, refund = asyncio.run(run())
    assert ticket == Ticket("gpt-4o-mini", 11 + DEFAULT_OUTPUT_TOKENS)
    # the answer took 16 tokens: the rest of the guess goes back to the shard's balance
    assert refund == pytest.approx(11 + DEFAULT_OUTPUT_TOKENS - 16)


def test_the_jobs_own_rpm_seeds_when_the_environment_has_none(table: Any) -> None:
    at = FakeTime()

    async def run() -> None:
        await _limit(table, "job#0", at, seeds={"other-model": RateSeed(rpm=5)}, default_seed=RateSeed(rpm=600)).take(
            _chat(1)
        )

    asyncio.run(run())
    bucket = _item(table)
    assert bucket.rate == pytest.approx(10.0) and bucket.token_rate == 0.0


def test_headers_win_over_the_seed_and_a_changed_limit_is_followed(table: Any) -> None:
    at = FakeTime()
    headers = {"x-ratelimit-limit-requests": "600", "x-ratelimit-limit-tokens": "30000"}

    async def run() -> None:
        limit = _limit(table, "job#0", at, seeds=SEEDS)
        ticket = await limit.take(_chat(1))
        limit.observe(ticket, 200, {**headers, "x-ratelimit-remaining-requests": "599"})
        await limit.close()

    asyncio.run(run())
    bucket = _item(table)
    assert (bucket.rate, bucket.token_rate) == (pytest.approx(10.0), pytest.approx(500.0))
    # the provider's bucket holds a minute: so does the shared one from the first headers on
    assert bucket.window_s == 60.0
    assert bucket.level <= 600.0 and bucket.token_level <= 30_000.0

    async def same() -> None:
        limit = _limit(table, "job#1", at)
        limit.observe(await limit.take(_chat(2)), 200, headers)
        await limit.close()

    version = bucket.version
    asyncio.run(same())
    # the same limit again: the lease and its return are the only writes
    assert _item(table).version == version + 2


def test_a_429_that_says_the_quota_is_spent_pauses_every_shard_until_the_reset(table: Any) -> None:
    at = FakeTime()
    spent = {
        "x-ratelimit-limit-requests": "1200",
        "x-ratelimit-remaining-requests": "0",
        "retry-after-ms": "3000",
        "retry-after": "3",
    }

    async def run() -> tuple[float, float]:
        first = _limit(table, "job-a#0", at, seeds=SEEDS)
        other = _limit(table, "job-b#0", at, seeds=SEEDS)
        ticket = await first.take(_chat(1, max_tokens=16))
        await other.take(_chat(2, max_tokens=16))
        first.observe(ticket, 429, spent)
        await first.close()
        paused_at = at.now
        # the other shard still holds its lease; once spent, its next lease waits for the reset
        while other._local("gpt-4o-mini").requests > 0:
            await other.take(_chat(3, max_tokens=16))
        await other.take(_chat(4, max_tokens=16))
        return paused_at, at.now

    paused_at, resumed_at = asyncio.run(run())
    assert resumed_at >= paused_at + 3.0
    bucket = _item(table)
    assert bucket.paused_until == pytest.approx(paused_at + 3.0)


def test_a_wave_of_429s_a_moment_apart_is_one_pause_written(table: Any) -> None:
    """Twenty answers that each say the quota is spent, their resets 50 ms apart: the shard waits
    for the last, and the item is written once for them, not once an answer."""
    at = FakeTime()

    async def run() -> tuple[int, float]:
        limit = _limit(table, "job#0", at, seeds=SEEDS)
        tickets = [await limit.take(_chat(n, max_tokens=16)) for n in range(20)]
        await asyncio.gather(*limit._writes)
        before = limit.table.writes
        for n, ticket in enumerate(tickets):
            headers = {
                "x-ratelimit-limit-requests": "1200",
                "x-ratelimit-remaining-requests": "0",
                "retry-after-ms": str(3000 + 50 * n),
            }
            limit.observe(ticket, 429, headers)
        await asyncio.gather(*limit._writes)
        return limit.table.writes - before, limit._local("gpt-4o-mini").paused_until

    writes, paused_until = asyncio.run(run())
    assert paused_until == pytest.approx(at.now + 3.95)
    assert writes == 1
    assert _item(table).paused_until == pytest.approx(at.now + 3.0)


def test_a_run_that_knows_its_count_leases_no_more_and_has_nothing_to_give_back(table: Any) -> None:
    """A collect run of three polls: one lease of three requests, and no write at the end, where a
    run that does not know its count leases a period's share and gives the rest back."""
    at = FakeTime()

    async def run(expected: int | None) -> tuple[int, int]:
        limit = _limit(table, f"job#{expected}", at, seeds=SEEDS, expected=expected)
        for n in range(3):
            await limit.take(_chat(n))
        before = limit.table.writes
        await limit.close()
        return limit._local("gpt-4o-mini").requests, limit.table.writes - before

    _, unknown_writes = asyncio.run(run(None))
    assert unknown_writes == 1
    left, writes = asyncio.run(run(3))
    assert (left, writes) == (0, 0)


def test_a_collect_runs_polls_under_a_token_limit_take_no_tokens_and_leave_nothing_to_give_back(table: Any) -> None:
    """Polls (a GET with no body) cost no tokens: under a key with a token limit, a run of five
    that knows its count leases five requests and no tokens, sends them all, and writes nothing at
    the end (it once waited forever for a token balance its leases never gave it)."""
    at = FakeTime()
    polls = [Request(n, f"c{n}", "GET", f"/v1/responses/resp_{n}", None) for n in range(5)]

    async def run() -> tuple[int, int]:
        limit = _limit(table, "job#0", at, default_seed=RateSeed(rpm=600, tpm=60_000), expected=5)
        for poll in polls:
            await asyncio.wait_for(limit.take(poll), timeout=5)
        before = limit.table.writes
        await limit.close()
        return limit._local("").requests, limit.table.writes - before

    assert asyncio.run(run()) == (0, 0)


def test_a_collect_run_that_learns_the_rate_leases_only_the_polls_it_has_left(table: Any) -> None:
    """The first collect run of a key creates its item from its first answer while its other polls
    go unpaced: those count against its expected polls, so its lease asks for the rest alone and
    the run writes nothing at the end (it once leased its whole count again and gave most back:
    four writes to a new item in a second where three do)."""
    at = FakeTime()
    headers = {"x-ratelimit-limit-requests": "1200", "x-ratelimit-remaining-requests": "1199"}
    polls = [Request(n, f"c{n}", "GET", f"/v1/responses/resp_{n}", None) for n in range(6)]

    async def run() -> tuple[int, int, int]:
        limit = _limit(table, "job#0", at, expected=6)
        first = [await limit.take(poll) for poll in polls[:4]]
        limit.observe(first[0], 200, headers)
        while limit._local("").joining is not None:
            await asyncio.sleep(0)
        for poll in polls[4:]:
            await asyncio.wait_for(limit.take(poll), timeout=5)
        before = limit.table.writes
        await limit.close()
        return limit._local("").requests, limit.table.writes - before, limit.table.writes

    left, at_close, writes = asyncio.run(run())
    assert (left, at_close) == (0, 0)
    # the claim, and the item made from the answer with the lease of the polls left in it
    assert writes == 2


def test_a_429_with_quota_left_is_the_requests_alone(table: Any) -> None:
    at = FakeTime()
    overloaded = {"x-ratelimit-limit-requests": "1200", "x-ratelimit-remaining-requests": "900", "retry-after": "2"}

    async def run() -> int:
        limit = _limit(table, "job#0", at, seeds=SEEDS)
        ticket = await limit.take(_chat(1))
        limit.observe(ticket, 429, overloaded)
        await limit.close()
        return limit.table.writes

    writes = asyncio.run(run())
    assert _item(table).paused_until == 0.0
    # the seed, the lease, the window the first headers widen, and the lease given back
    assert writes == 4


def test_a_run_gives_back_what_it_did_not_spend(table: Any) -> None:
    at = FakeTime()

    async def run() -> None:
        limit = _limit(table, "job#0", at, seeds=SEEDS)
        for n in range(5):
            limit.settle(await limit.take(_chat(n, max_tokens=16)), {"usage": {"total_tokens": 20}})
        await limit.close()

    asyncio.run(run())
    bucket = _item(table)
    # the 40 leased, 5 spent: 35 back, with the tokens the 5 did not use
    assert bucket.level == pytest.approx(200.0 - 5)
    assert bucket.token_level == pytest.approx(10_000.0 - 5 * 20)
    assert seated(bucket, at.now) == {}


def test_a_token_bound_shard_waits_for_tokens_not_requests(table: Any) -> None:
    at = FakeTime()
    # 1,000 tokens a minute; each request is estimated at 11 + 100 tokens
    seeds = {"gpt-4o-mini": RateSeed(rpm=6000, tpm=1000)}

    async def run() -> int:
        limit = _limit(table, "job#0", at, seeds=seeds)
        sent = 0
        while at.now < 1_000.0 + 60.0:
            ticket = await limit.take(_chat(sent, max_tokens=100))
            limit.settle(ticket, {"usage": {"total_tokens": 111}})
            sent += 1
        return sent

    sent = asyncio.run(run())
    # a minute of 1,000 tokens plus the 10 s burst: about 12,000 / 111 requests, not 6,000
    assert 8 <= sent <= (1000 + 1000 * 10 / 60) / 111 + 2


# --- before anybody knows the rate (issue 31) ---------------------------------------------------


def test_one_shard_learns_the_rate_while_the_others_wait_for_it(table: Any) -> None:
    """No seed, no item: the first shard to look sends unpaced and learns from its answer; a
    second shard waits for that answer instead of sending a wave of its own."""
    at = FakeTime()
    headers = {"x-ratelimit-limit-requests": "1200", "x-ratelimit-remaining-requests": "1199"}

    async def run() -> tuple[Ticket, SharedLimit]:
        first = _limit(table, "job-a#0", at)
        other = _limit(table, "job-b#0", at)
        ticket = await first.take(_chat(1))
        waiting = asyncio.create_task(other.take(_chat(2)))
        while other.table.reads < 1:
            await asyncio.sleep(0)
        for _ in range(50):
            await asyncio.sleep(0)
        # it found the item being learned, and waits rather than send a request of its own
        assert not waiting.done()
        first.observe(ticket, 200, headers)
        got = await waiting
        await first.close()
        return got, other

    _, other = asyncio.run(run())
    local = other._local("gpt-4o-mini")
    # it leased from the learned bucket: nothing went unpaced, and the item counts its lease
    assert local.rate == pytest.approx(20.0) and not local.unpaced
    assert set(seated(_item(table), at.now)) == {seat_of("job-b#0")}


def test_the_learner_leases_for_its_waiting_requests_in_the_write_that_makes_the_item(table: Any) -> None:
    """A collect run of four polls: its first answer with rate headers makes the key's item while
    three polls are still to go, and the item is made with their lease in it, one write (it was
    the claim, the item and then the lease: three writes to a new item at once)."""
    at = FakeTime()
    headers = {"x-ratelimit-limit-requests": "1200", "x-ratelimit-remaining-requests": "1199"}
    polls = [Request(n, f"c{n}", "GET", f"/v1/responses/resp_{n}", None) for n in range(4)]

    async def run() -> tuple[int, int]:
        limit = _limit(table, "job-a#0", at, expected=4)
        first = await limit.take(polls[0])
        claimed = limit.table.writes
        limit.observe(first, 200, headers)
        for poll in polls[1:]:
            await asyncio.wait_for(limit.take(poll), timeout=5)
        await limit.close()
        return claimed, limit.table.writes - claimed

    claimed, after = asyncio.run(run())
    assert claimed == 1
    assert after == 1
    made = BucketTable(table).load(limit_key("http://p/v1", "sk-x", ""))
    assert made is not None and any(made.seats)


def test_the_learned_level_leaves_out_what_was_sent_after_the_answered_request(table: Any) -> None:
    """The learning shard sent 50 requests before its first answer came back saying 1,199 of
    1,200 remain: that answer's request went first, so the 49 sent after it are not in what it
    says remains, and the bucket holds at most 1,150 (a full provider bucket overshot by them
    ended a run with 429s)."""
    at = FakeTime()
    headers = {"x-ratelimit-limit-requests": "1200", "x-ratelimit-remaining-requests": "1199"}

    async def run() -> None:
        limit = _limit(table, "job-a#0", at)
        tickets = []
        for n in range(50):
            tickets.append(await limit.take(_chat(n)))
            at.now += 0.001
        limit.observe(tickets[0], 200, headers)
        while limit._local("gpt-4o-mini").joining is not None:
            await asyncio.sleep(0)

    asyncio.run(run())
    assert _item(table).level <= 1199 - 49


def test_answers_without_a_rate_let_every_shard_send(table: Any) -> None:
    """The learning shard's answers are 404s without rate headers: the others stop waiting and
    send at their own concurrency."""
    at = FakeTime()

    async def run() -> SharedLimit:
        first = _limit(table, "job-a#0", at)
        other = _limit(table, "job-b#0", at)
        first.observe(await first.take(_chat(1)), 404, {"content-type": "application/json"})
        await first.close()
        for n in range(50):
            await other.take(_chat(n))
        return other

    other = asyncio.run(run())
    assert len(other._local("gpt-4o-mini").unpaced) == 50
    assert at.now < 1_000.0 + 1.0


def test_a_provider_without_rate_headers_is_remembered_for_the_next_jobs(table: Any) -> None:
    at = FakeTime()

    async def run() -> SharedLimit:
        first = _limit(table, "job-a#0", at)
        first.observe(await first.take(_chat(1)), 200, {"content-type": "application/json"})
        await first.close()
        later = _limit(table, "job-b#0", at)
        await later.take(_chat(2))
        return later

    later = asyncio.run(run())
    assert later._local("gpt-4o-mini").off
    # one read, no claim of its own
    assert (later.table.reads, later.table.writes) == (1, 0)


def test_the_first_headers_on_a_seeded_bucket_spend_what_the_provider_says_remains(table: Any) -> None:
    """A seed makes a bucket of 10 s of the rate; the first answer says 1,150 of 1,200 remain: the
    bucket then holds a minute, and what remains, less the lease a lessee may hold unsent."""
    at = FakeTime()
    headers = {"x-ratelimit-limit-requests": "1200", "x-ratelimit-remaining-requests": "1150"}

    async def run() -> None:
        limit = _limit(table, "job#0", at, seeds={"gpt-4o-mini": RateSeed(rpm=1200)})
        limit.observe(await limit.take(_chat(1)), 200, headers)
        await limit.close()

    asyncio.run(run())
    bucket = _item(table)
    assert bucket.window_s == 60.0
    # 1,150 less one lease (2 s of the rate) a lessee may hold, and the 39 this one gave back
    assert bucket.level == pytest.approx(1150 - 40 + 39)


def test_a_gemini_429_whose_body_asks_for_a_wait_pauses_every_shard_that_long(table: Any) -> None:
    """Gemini states no limits in its headers: its RESOURCE_EXHAUSTED body's RetryInfo says the quota
    is spent, and for how long."""
    from sluice.providers import GEMINI
    from sluice.send.classify import throttle_said

    at = FakeTime()
    body = {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "4s"}],
        }
    }

    async def run() -> float:
        limit = _limit(table, "job#0", at, seeds=SEEDS)
        limit.format = GEMINI
        ticket = await limit.take(_chat(1, max_tokens=16))
        limit.observe(ticket, 429, {}, throttle_said(429, orjson.dumps(body), GEMINI))
        await limit.close()
        return at.now

    paused_at = asyncio.run(run())
    assert _item(table).paused_until == pytest.approx(paused_at + 4.0)
    # a 429 whose body asks for nothing stays the request's alone, and another answer's body is not read
    assert throttle_said(200, orjson.dumps(body), GEMINI) is None
    assert throttle_said(429, b"not json", GEMINI) is None
