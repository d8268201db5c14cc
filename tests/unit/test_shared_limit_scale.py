"""The shared limit at a thousand shards (issue 30): the item's size, its reads and writes a second,
and lost writes, measured on a recording table under a virtual clock."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from sluice.contract import RateSeed
from sluice.contract.model import Request
from sluice.core.retry import table_retry_delay_s
from sluice.limits.lease import LeasePolicy
from sluice.limits.shared import SharedLimit
from sluice.limits.table import BucketTable
from sluice.providers import OPENAI

from tests.unit.helpers.shared_limit_scale import RecordingTable

POLICY = LeasePolicy()
# 1,200 requests a minute, the environment's figure, so the item exists before any answer
SEEDS = {"m": RateSeed(rpm=1200)}
RATE = 20.0
# DynamoDB's limit on one item
ITEM_LIMIT = 400 * 1024


class VirtualTime:
    """A clock and a sleep for many tasks at once: time jumps to the next wake-up only when every
    live task waits on this clock (a DynamoDB call on a thread is not waiting)."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._parked = 0
        self._changed = asyncio.Event()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + max(0.0, seconds), next(self._order), future))
        self._parked += 1
        self._changed.set()
        await future

    async def run(self, tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.add_done_callback(lambda _: self._changed.set())
        while True:
            while self._parked < sum(not t.done() for t in tasks):
                self._changed.clear()
                await self._changed.wait()
            if all(t.done() for t in tasks):
                for task in tasks:
                    task.result()
                return
            when = self._timers[0][0]
            self.now = max(self.now, when)
            while self._timers and self._timers[0][0] <= when:
                _, _, future = heapq.heappop(self._timers)
                self._parked -= 1
                future.set_result(None)


def _request(n: int) -> Request:
    return Request(n, f"r{n}", "POST", "/v1/chat/completions", b'{"model":"m"}')


def _limit(table: Any, lessee: str, time: VirtualTime, **kwargs: Any) -> SharedLimit:
    return SharedLimit(
        BucketTable(table, clock=time.clock),
        base_url="http://p/v1",
        api_key="sk-x",
        lessee=lessee,
        request_format=OPENAI,
        policy=POLICY,
        clock=time.clock,
        sleep=time.sleep,
        **{"seeds": SEEDS, **kwargs},
    )


def _draw(
    lessees: int, seconds: float, counted_from: float = 0.0
) -> tuple[RecordingTable, VirtualTime, dict[str, int]]:
    """`lessees` shards, each taking requests as fast as the limit lets it, for `seconds`; each
    one's requests taken from `counted_from` seconds on."""
    time = VirtualTime()
    table = RecordingTable(time.clock)
    taken: dict[str, int] = {}
    start, end = time.now + counted_from, time.now + seconds

    async def shard(limit: SharedLimit) -> None:
        n = 0
        while time.now < end:
            await limit.take(_request(n))
            if start <= time.now < end:
                taken[limit.lessee] = taken.get(limit.lessee, 0) + 1
            n += 1

    async def run() -> None:
        limits = [_limit(table, f"job#{i}", time) for i in range(lessees)]
        tasks = [asyncio.create_task(shard(limit)) for limit in limits]
        await time.run(tasks)

    asyncio.run(run())
    return table, time, taken


@pytest.mark.slow
def test_the_item_stays_small_whatever_the_number_of_lessees() -> None:
    """5,000 shards of 50 jobs leasing on a 30,000 RPM key of a model with a long name, each still
    in its period when the last leases: the item stays under 1 KB, one write unit a write (1,025
    bytes cost two), where a map with an entry per lessee grows past DynamoDB's 400 KB at 6,000 to
    12,000."""
    time = VirtualTime()
    table = RecordingTable(time.clock)
    model = "anthropic.claude-3-5-sonnet-20241022-v2:0"

    async def run() -> None:
        for i in range(5_000):
            limit = _limit(table, f"job-{i // 100:04d}#{i % 100}", time, seeds={model: RateSeed(rpm=30_000)})
            # a lessee's own sleeps move the clock on here: it is the only task
            limit._sleep = _advance(time)
            request = Request(i, f"r{i}", "POST", "/v1/chat/completions", b'{"model":"%s"}' % model.encode())
            await limit.take(request)
            if i % 500 == 499:
                assert table.largest <= 1_024, (i + 1, table.largest)

    asyncio.run(run())
    assert 640 < table.largest <= 1_024


def _advance(time: VirtualTime) -> Callable[[float], Any]:
    async def sleep(seconds: float) -> None:
        # at least a millisecond: a wait too small to move a clock near 1,000 would never end
        time.now += max(0.001, seconds)

    return sleep


@pytest.mark.parametrize("lessees", [10, 100, 1_000])
@pytest.mark.slow
def test_reads_and_writes_a_second_follow_the_rate_not_the_lessees(lessees: int) -> None:
    """Shards drawing as fast as they may on a 1,200 RPM key: once each has joined (its first
    lease), the item's reads and writes a second stay under a few times the rate / min_requests
    (20 / 25 = 0.8), for 10 shards as for 1,000; waiting for capacity costs no reads."""
    table, _, taken = _draw(lessees, 60.0)
    start, end = 1_010.0, 1_060.0
    bound = 3 * RATE / POLICY.min_requests
    reads, writes = table.per_second("read", start, end), table.per_second("write", start, end)
    assert writes <= bound, (lessees, writes)
    assert reads <= bound, (lessees, reads)
    # and the rate was used: over the minute, the bucket's burst plus a minute of its rate, give or
    # take a lease per lessee
    total = sum(taken.values())
    assert total <= RATE * POLICY.burst_s + RATE * 60 + POLICY.min_requests * lessees
    assert total >= RATE * 60 * 0.9


def test_lessees_share_the_rate_fairly() -> None:
    """Ten shards drawing as fast as they may: past the first seconds (where the full bucket goes
    to whoever asks first), each takes a tenth of the rate."""
    _, _, taken = _draw(10, 150.0, counted_from=30.0)
    counts = sorted(taken.values())
    assert len(counts) == 10
    assert counts[0] >= counts[-1] * 0.8, counts
    assert sum(counts) == pytest.approx(RATE * 120, rel=0.1)


def test_a_lost_write_is_tried_again_after_a_jittered_wait() -> None:
    """Another writer wins the item three times in a row: the lessee waits a little longer each
    time, at random, instead of reading and writing again at once."""
    time = VirtualTime()
    table = RecordingTable(time.clock)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        time.now += seconds

    async def run() -> None:
        first = _limit(table, "job#0", time)
        first._sleep = sleep
        await first.take(_request(0))
        slept.clear()
        table.lose_next = 3
        other = _limit(table, "job#1", time)
        other._sleep = sleep
        await other.take(_request(1))

    asyncio.run(run())
    waits = [s for s in slept if s > 0]
    assert len(waits) == 3, slept
    assert len(set(waits)) == 3
    ceilings = [table_retry_delay_s(n, lambda: 1.0) for n in (1, 2, 3)]
    assert all(0 < w <= c for w, c in zip(waits, ceilings, strict=True)), waits
