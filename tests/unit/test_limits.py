from __future__ import annotations

import asyncio

import pytest
from sluice.limits.flow import AdaptiveLimit, RatePacer
from sluice.providers import OPENAI


class FakeClock:
    """A clock that only moves when something sleeps on it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_starts_at_cap_or_initial() -> None:
    assert AdaptiveLimit(100).limit == 100
    assert AdaptiveLimit(100, initial=10).limit == 10
    assert AdaptiveLimit(100, initial=1000).limit == 100
    assert AdaptiveLimit(100, initial=0).limit == 1


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # one 429 per fresh generation halves each time, floored at 1
        ("T", 50),
        ("TT", 25),
        ("TTTTTTTTTT", 1),
        # additive increase: ~+1 per `limit` successes, never past the cap
        ("T" + "S" * 50, 50),
        ("T" + "S" * 51, 51),
        ("T" + "S" * 200, 53),
        ("S" * 10, 100),
    ],
)
def test_aimd_table(events: str, expected: int) -> None:
    lim = AdaptiveLimit(100)
    for e in events:
        if e == "T":
            assert lim.on_throttled(lim.generation)
        else:
            lim.on_success()
    assert lim.limit == expected


def test_burst_from_one_window_halves_once() -> None:
    async def scenario() -> None:
        lim = AdaptiveLimit(64)
        tokens = [await lim.acquire() for _ in range(64)]
        shrank = [lim.on_throttled(t) for t in tokens]
        assert shrank.count(True) == 1
        assert lim.limit == 32
        for _ in tokens:
            lim.release()
        # a request granted after the cut belongs to the new window and may cut again
        t = await lim.acquire()
        assert lim.on_throttled(t)
        assert lim.limit == 16
        lim.release()

    asyncio.run(scenario())


def test_tolerance_ignores_a_few_429s_per_window_and_halves_past_it() -> None:
    async def scenario() -> None:
        lim = AdaptiveLimit(100, tolerance=0.2)
        tokens = [await lim.acquire() for _ in range(100)]
        # 20 of 100 throttled: within tolerance
        assert not any(lim.on_throttled(t) for t in tokens[:20])
        assert lim.limit == 100
        # the 21st tips the window over, once
        assert lim.on_throttled(tokens[20])
        assert not any(lim.on_throttled(t) for t in tokens[21:])
        assert lim.limit == 50

    asyncio.run(scenario())


def test_windows_roll_over_so_steady_random_429s_never_accumulate() -> None:
    async def scenario() -> None:
        lim = AdaptiveLimit(50, tolerance=0.2)
        for _ in range(100):  # 100 windows of 50, each with 10% throttled
            tokens = [await lim.acquire() for _ in range(50)]
            for i, t in enumerate(tokens):
                if i % 10 == 0:
                    lim.on_throttled(t)
                else:
                    lim.on_success(t)
                lim.release()
        assert lim.limit == 50

    asyncio.run(scenario())


def test_acquire_blocks_at_limit_and_release_wakes_fifo() -> None:
    async def scenario() -> None:
        lim = AdaptiveLimit(2)
        await lim.acquire()
        await lim.acquire()
        order: list[int] = []

        async def waiter(i: int) -> None:
            await lim.acquire()
            order.append(i)

        tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
        await asyncio.sleep(0)
        assert order == [] and lim.in_flight == 2
        lim.release()
        await asyncio.sleep(0)
        assert order == [0]
        lim.release()
        lim.release()
        await asyncio.sleep(0)
        assert order == [0, 1, 2]
        assert lim.in_flight == 2
        for t in tasks:
            await t

    asyncio.run(scenario())


def test_shrunk_limit_holds_back_new_slots_until_regrown() -> None:
    async def scenario() -> None:
        lim = AdaptiveLimit(4)
        tokens = [await lim.acquire() for _ in range(4)]
        lim.on_throttled(tokens[0])
        assert lim.limit == 2
        for _ in range(3):
            lim.release()
        # one still in flight, limit 2: exactly one more fits
        await lim.acquire()
        blocked = asyncio.create_task(lim.acquire())
        await asyncio.sleep(0)
        assert not blocked.done()
        lim.on_success()
        lim.on_success()  # 2 -> 2.5 -> 2.9: not yet a whole slot
        await asyncio.sleep(0)
        assert not blocked.done()
        lim.on_success()  # -> 3.24
        await asyncio.sleep(0)
        assert blocked.done()

    asyncio.run(scenario())


def test_cancelled_waiter_does_not_leak_a_slot() -> None:
    async def scenario() -> None:
        lim = AdaptiveLimit(1)
        await lim.acquire()
        waiting = asyncio.create_task(lim.acquire())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        lim.release()
        assert lim.in_flight == 0
        await asyncio.wait_for(lim.acquire(), 1)

    asyncio.run(scenario())


def test_unlimited_pacer_never_waits() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        pacer = RatePacer(0, 0, clock=clock, sleep=clock.sleep)
        assert not pacer.active
        for _ in range(1000):
            assert await pacer.take(10_000) == 0
        assert clock.sleeps == []

    asyncio.run(scenario())


def test_rpm_paces_evenly_after_burst() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        pacer = RatePacer(rpm=600, clock=clock, sleep=clock.sleep)  # 10/s, burst of 10
        start = clock.now
        for _ in range(70):
            await pacer.take()
        # 10 free from the burst, then 60 more at 10 per second
        assert clock.now - start == pytest.approx(6.0)
        assert all(s == pytest.approx(0.1) for s in clock.sleeps)

    asyncio.run(scenario())


def test_concurrent_takers_queue_in_time() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        # fake sleep that doesn't advance the clock: every taker reserves at the same instant
        waits: list[float] = []

        async def record(s: float) -> None:
            waits.append(s)

        pacer = RatePacer(rpm=60, clock=clock, sleep=record)
        got = await asyncio.gather(*(pacer.take() for _ in range(5)))
        assert got == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])

    asyncio.run(scenario())


def test_tpm_paces_by_tokens_and_lets_oversized_requests_through() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        pacer = RatePacer(tpm=6000, clock=clock, sleep=clock.sleep)  # 100 tokens/s
        start = clock.now
        await pacer.take(100)  # the burst
        await pacer.take(500)  # bigger than the bucket: allowed, paid back over 5 s
        await pacer.take(100)
        assert clock.now - start == pytest.approx(6.0)

    asyncio.run(scenario())


def test_remaining_zero_blocks_until_reset() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        pacer = RatePacer(clock=clock, sleep=clock.sleep)
        pacer.observe_headers({"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "9s"}, OPENAI)
        assert not pacer.active
        pacer.observe_headers(
            {
                "x-ratelimit-remaining-requests": "3",
                "x-ratelimit-remaining-tokens": "0",
                "x-ratelimit-reset-tokens": "2.5s",
            },
            OPENAI,
        )
        assert pacer.active
        assert await pacer.take() == pytest.approx(2.5)
        # the pause is over: the next take goes straight through
        assert await pacer.take() == 0
        assert not pacer.active

    asyncio.run(scenario())


def test_remaining_zero_without_reset_pauses_briefly() -> None:
    async def scenario() -> None:
        clock = FakeClock()
        pacer = RatePacer(clock=clock, sleep=clock.sleep)
        pacer.observe_headers({"x-ratelimit-remaining-requests": "0"}, OPENAI)
        assert await pacer.take() == pytest.approx(1.0)

    asyncio.run(scenario())
