"""The shared rate limit on a moto table: two shards drawing at once, seeds, limits the headers
change, a spent quota pausing every shard, leases sized to a run's count and given back."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sluice.contract import RateSeed
from sluice.contract.model import Request
from sluice.limits.lease import LeasePolicy, seat_of
from sluice.limits.shared import DEFAULT_OUTPUT_TOKENS, SharedLimit, Ticket
from sluice.limits.table import BucketTable
from sluice.providers import OPENAI

from tests.unit.limit_fakes import SEEDS, FakeTime, chat, jobs_table, limit_item, request, seated, shared_limit


@pytest.fixture
def table() -> Iterator[Any]:
    with jobs_table() as made:
        yield made


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
            model = await limit.take(request(n))
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


def test_a_configured_limit_seeds_the_bucket_before_any_answer(table: Any) -> None:
    at = FakeTime()

    async def run() -> list[Ticket]:
        limit = shared_limit(table, "job#0", at, seeds=SEEDS, default_seed=RateSeed(rpm=60))
        return [await limit.take(chat(n, max_tokens=16)) for n in range(3)]

    tickets = asyncio.run(run())
    # no probe: every request was leased from a bucket sized by the environment's figure
    bucket = limit_item(table)
    assert (bucket.rate, bucket.token_rate) == (pytest.approx(20.0), pytest.approx(1000.0))
    assert set(seated(bucket, at.now)) == {seat_of("job#0")}
    assert bucket.level == pytest.approx(200.0 - 40)
    assert [t.tokens for t in tickets] == [11 + 16] * 3


def test_a_request_that_caps_no_output_is_charged_the_pacing_guess_until_its_answer_settles(table: Any) -> None:
    at = FakeTime()

    async def run() -> tuple[Ticket, float]:
        limit = shared_limit(table, "job#0", at, seeds=SEEDS)
        ticket = await limit.take(chat(1))
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
        await shared_limit(
            table, "job#0", at, seeds={"other-model": RateSeed(rpm=5)}, default_seed=RateSeed(rpm=600)
        ).take(chat(1))

    asyncio.run(run())
    bucket = limit_item(table)
    assert bucket.rate == pytest.approx(10.0) and bucket.token_rate == 0.0


def test_headers_win_over_the_seed_and_a_changed_limit_is_followed(table: Any) -> None:
    at = FakeTime()
    headers = {"x-ratelimit-limit-requests": "600", "x-ratelimit-limit-tokens": "30000"}

    async def run() -> None:
        limit = shared_limit(table, "job#0", at, seeds=SEEDS)
        ticket = await limit.take(chat(1))
        limit.observe(ticket, 200, {**headers, "x-ratelimit-remaining-requests": "599"})
        await limit.close()

    asyncio.run(run())
    bucket = limit_item(table)
    assert (bucket.rate, bucket.token_rate) == (pytest.approx(10.0), pytest.approx(500.0))
    # the provider's bucket holds a minute: so does the shared one from the first headers on
    assert bucket.window_s == 60.0
    assert bucket.level <= 600.0 and bucket.token_level <= 30_000.0

    async def same() -> None:
        limit = shared_limit(table, "job#1", at)
        limit.observe(await limit.take(chat(2)), 200, headers)
        await limit.close()

    version = bucket.version
    asyncio.run(same())
    # the same limit again: the lease and its return are the only writes
    assert limit_item(table).version == version + 2


def test_a_429_that_says_the_quota_is_spent_pauses_every_shard_until_the_reset(table: Any) -> None:
    at = FakeTime()
    spent = {
        "x-ratelimit-limit-requests": "1200",
        "x-ratelimit-remaining-requests": "0",
        "retry-after-ms": "3000",
        "retry-after": "3",
    }

    async def run() -> tuple[float, float]:
        first = shared_limit(table, "job-a#0", at, seeds=SEEDS)
        other = shared_limit(table, "job-b#0", at, seeds=SEEDS)
        ticket = await first.take(chat(1, max_tokens=16))
        await other.take(chat(2, max_tokens=16))
        first.observe(ticket, 429, spent)
        await first.close()
        paused_at = at.now
        # the other shard still holds its lease; once spent, its next lease waits for the reset
        while other._local("gpt-4o-mini").requests > 0:
            await other.take(chat(3, max_tokens=16))
        await other.take(chat(4, max_tokens=16))
        return paused_at, at.now

    paused_at, resumed_at = asyncio.run(run())
    assert resumed_at >= paused_at + 3.0
    bucket = limit_item(table)
    assert bucket.paused_until == pytest.approx(paused_at + 3.0)


def test_a_wave_of_429s_a_moment_apart_is_one_pause_written(table: Any) -> None:
    """Twenty answers that each say the quota is spent, their resets 50 ms apart: the shard waits
    for the last, and the item is written once for them, not once an answer."""
    at = FakeTime()

    async def run() -> tuple[int, float]:
        limit = shared_limit(table, "job#0", at, seeds=SEEDS)
        tickets = [await limit.take(chat(n, max_tokens=16)) for n in range(20)]
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
    assert limit_item(table).paused_until == pytest.approx(at.now + 3.0)


def test_a_run_that_knows_its_count_leases_no_more_and_has_nothing_to_give_back(table: Any) -> None:
    """A collect run of three polls: one lease of three requests, and no write at the end, where a
    run that does not know its count leases a period's share and gives the rest back."""
    at = FakeTime()

    async def run(expected: int | None) -> tuple[int, int]:
        limit = shared_limit(table, f"job#{expected}", at, seeds=SEEDS, expected=expected)
        for n in range(3):
            await limit.take(chat(n))
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
        limit = shared_limit(table, "job#0", at, default_seed=RateSeed(rpm=600, tpm=60_000), expected=5)
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
        limit = shared_limit(table, "job#0", at, expected=6)
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
        limit = shared_limit(table, "job#0", at, seeds=SEEDS)
        ticket = await limit.take(chat(1))
        limit.observe(ticket, 429, overloaded)
        await limit.close()
        return limit.table.writes

    writes = asyncio.run(run())
    assert limit_item(table).paused_until == 0.0
    # the seed, the lease, the window the first headers widen, and the lease given back
    assert writes == 4


def test_a_run_gives_back_what_it_did_not_spend(table: Any) -> None:
    at = FakeTime()

    async def run() -> None:
        limit = shared_limit(table, "job#0", at, seeds=SEEDS)
        for n in range(5):
            limit.settle(await limit.take(chat(n, max_tokens=16)), {"usage": {"total_tokens": 20}})
        await limit.close()

    asyncio.run(run())
    bucket = limit_item(table)
    # the 40 leased, 5 spent: 35 back, with the tokens the 5 did not use
    assert bucket.level == pytest.approx(200.0 - 5)
    assert bucket.token_level == pytest.approx(10_000.0 - 5 * 20)
    assert seated(bucket, at.now) == {}


def test_a_token_bound_shard_waits_for_tokens_not_requests(table: Any) -> None:
    at = FakeTime()
    # 1,000 tokens a minute; each request is estimated at 11 + 100 tokens
    seeds = {"gpt-4o-mini": RateSeed(rpm=6000, tpm=1000)}

    async def run() -> int:
        limit = shared_limit(table, "job#0", at, seeds=seeds)
        sent = 0
        while at.now < 1_000.0 + 60.0:
            ticket = await limit.take(chat(sent, max_tokens=100))
            limit.settle(ticket, {"usage": {"total_tokens": 111}})
            sent += 1
        return sent

    sent = asyncio.run(run())
    # a minute of 1,000 tokens plus the 10 s burst: about 12,000 / 111 requests, not 6,000
    assert 8 <= sent <= (1000 + 1000 * 10 / 60) / 111 + 2
