"""The shared rate limit before anybody knows the rate: one shard learns it while the others wait,
the item made from the first answer with limits, and a provider that says none."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from sluice.contract import RateSeed
from sluice.contract.model import Request
from sluice.limits.lease import seat_of
from sluice.limits.shared import SharedLimit, Ticket, limit_key
from sluice.limits.table import BucketTable

from tests.unit.limit_fakes import SEEDS, FakeTime, chat, jobs_table, limit_item, seated, shared_limit


@pytest.fixture
def table() -> Iterator[Any]:
    with jobs_table() as made:
        yield made


def test_one_shard_learns_the_rate_while_the_others_wait_for_it(table: Any) -> None:
    """No seed, no item: the first shard to look sends unpaced and learns from its answer; a
    second shard waits for that answer instead of sending a wave of its own."""
    at = FakeTime()
    headers = {"x-ratelimit-limit-requests": "1200", "x-ratelimit-remaining-requests": "1199"}

    async def run() -> tuple[Ticket, SharedLimit]:
        first = shared_limit(table, "job-a#0", at)
        other = shared_limit(table, "job-b#0", at)
        ticket = await first.take(chat(1))
        waiting = asyncio.create_task(other.take(chat(2)))
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
    assert set(seated(limit_item(table), at.now)) == {seat_of("job-b#0")}


def test_the_learner_leases_for_its_waiting_requests_in_the_write_that_makes_the_item(table: Any) -> None:
    """A collect run of four polls: its first answer with rate headers makes the key's item while
    three polls are still to go, and the item is made with their lease in it, one write (it was
    the claim, the item and then the lease: three writes to a new item at once)."""
    at = FakeTime()
    headers = {"x-ratelimit-limit-requests": "1200", "x-ratelimit-remaining-requests": "1199"}
    polls = [Request(n, f"c{n}", "GET", f"/v1/responses/resp_{n}", None) for n in range(4)]

    async def run() -> tuple[int, int]:
        limit = shared_limit(table, "job-a#0", at, expected=4)
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
        limit = shared_limit(table, "job-a#0", at)
        tickets = []
        for n in range(50):
            tickets.append(await limit.take(chat(n)))
            at.now += 0.001
        limit.observe(tickets[0], 200, headers)
        while limit._local("gpt-4o-mini").joining is not None:
            await asyncio.sleep(0)

    asyncio.run(run())
    assert limit_item(table).level <= 1199 - 49


def test_answers_without_a_rate_let_every_shard_send(table: Any) -> None:
    """The learning shard's answers are 404s without rate headers: the others stop waiting and
    send at their own concurrency."""
    at = FakeTime()

    async def run() -> SharedLimit:
        first = shared_limit(table, "job-a#0", at)
        other = shared_limit(table, "job-b#0", at)
        first.observe(await first.take(chat(1)), 404, {"content-type": "application/json"})
        await first.close()
        for n in range(50):
            await other.take(chat(n))
        return other

    other = asyncio.run(run())
    assert len(other._local("gpt-4o-mini").unpaced) == 50
    assert at.now < 1_000.0 + 1.0


def test_a_provider_without_rate_headers_is_remembered_for_the_next_jobs(table: Any) -> None:
    at = FakeTime()

    async def run() -> SharedLimit:
        first = shared_limit(table, "job-a#0", at)
        first.observe(await first.take(chat(1)), 200, {"content-type": "application/json"})
        await first.close()
        later = shared_limit(table, "job-b#0", at)
        await later.take(chat(2))
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
        limit = shared_limit(table, "job#0", at, seeds={"gpt-4o-mini": RateSeed(rpm=1200)})
        limit.observe(await limit.take(chat(1)), 200, headers)
        await limit.close()

    asyncio.run(run())
    bucket = limit_item(table)
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
        limit = shared_limit(table, "job#0", at, seeds=SEEDS)
        limit.format = GEMINI
        ticket = await limit.take(chat(1, max_tokens=16))
        limit.observe(ticket, 429, {}, throttle_said(429, orjson.dumps(body), GEMINI))
        await limit.close()
        return at.now

    paused_at = asyncio.run(run())
    assert limit_item(table).paused_until == pytest.approx(paused_at + 4.0)
    # a 429 whose body asks for nothing stays the request's alone, and another answer's body is not read
    assert throttle_said(200, orjson.dumps(body), GEMINI) is None
    assert throttle_said(429, b"not json", GEMINI) is None
