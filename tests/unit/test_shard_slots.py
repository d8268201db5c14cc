"""The environment's cap on shards in flight across its jobs: a second job's shard above the cap
waits for a slot, slots come back at a shard's end however it ends, and a dead shard's lapses."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from sluice.contract import create_table_request
from sluice.contract.rows import ShardRow
from sluice.limits.shard_slots import (
    SLOTS_KEY,
    WINDOW_S,
    WINDOWS,
    NoSlot,
    ShardSlots,
    SlotPolicy,
    Slots,
    give_back_held,
    moved_on,
    wait_s,
    waited_s,
)
from sluice.store.keys import shard_key

NOW = 1_750_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def table() -> Iterator[Any]:
    with mock_aws():
        boto3.client("dynamodb", region_name="us-east-1").create_table(**create_table_request("jobs"))
        yield boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")


class OneCallAtATime:
    """The table with each call applied whole before the next, as DynamoDB applies a conditional
    write; moto's backend, called from many threads, can interleave two of them."""

    def __init__(self, table: Any) -> None:
        self._table = table
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._table, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return call


def shards(table: Any, job: str, count: int) -> None:
    """The shard rows Plan writes."""
    for shard in range(count):
        table.put_item(Item={**shard_key(job, shard), "shard": shard, "status": "pending"})


def inflight(table: Any) -> int:
    return int(table.get_item(Key=SLOTS_KEY, ConsistentRead=True)["Item"]["inflight"])


def holding(table: Any, job: str, count: int) -> list[int]:
    return [s for s in range(count) if "slot_window" in table.get_item(Key=shard_key(job, s))["Item"]]


def test_a_second_jobs_shard_above_the_cap_waits_until_a_shard_of_the_first_gives_its_slot_back(table: Any) -> None:
    shards(table, "first", 2)
    shards(table, "second", 2)
    slots = ShardSlots(table, SlotPolicy(cap=2), clock=Clock(), rand=lambda: 1.0)

    assert slots.take("first", 0).taken and slots.take("first", 1).taken
    refused = slots.take("second", 0)

    assert not refused.taken and refused.wait_s == SlotPolicy(cap=2).first_wait_s
    assert inflight(table) == 2 and holding(table, "second", 2) == []
    assert not slots.take("second", 0, waits=1).taken
    assert slots.give_back("first", 0)
    assert slots.take("second", 0, waits=2).taken
    assert not slots.take("second", 1).taken
    assert inflight(table) == 2
    assert holding(table, "first", 2) == [1] and holding(table, "second", 2) == [0]


def test_shards_racing_from_many_jobs_never_hold_more_than_the_cap(table: Any) -> None:
    cap, jobs, per_job = 3, 4, 6
    for job in range(jobs):
        shards(table, f"job-{job}", per_job)
    slots = ShardSlots(OneCallAtATime(table), SlotPolicy(cap=cap), clock=Clock())
    lock = threading.Lock()
    held: set[tuple[str, int]] = set()
    most = 0
    finished: list[tuple[str, int]] = []

    def shard(job: str, index: int) -> None:
        nonlocal most
        waits = 0
        while not slots.take(job, index, waits=waits).taken:
            waits += 1
        with lock:
            held.add((job, index))
            most = max(most, len(held))
            held.discard((job, index))
            finished.append((job, index))
        slots.give_back(job, index)

    threads = [threading.Thread(target=shard, args=(f"job-{j}", s)) for j in range(jobs) for s in range(per_job)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(finished) == jobs * per_job
    assert most <= cap
    assert inflight(table) == 0


def test_a_retried_take_or_give_back_counts_once(table: Any) -> None:
    shards(table, "job", 2)
    slots = ShardSlots(table, SlotPolicy(cap=2), clock=Clock())

    assert slots.take("job", 0).taken
    assert slots.take("job", 0).taken
    assert inflight(table) == 1
    assert slots.give_back("job", 0)
    assert not slots.give_back("job", 0)
    assert inflight(table) == 0


def test_a_dead_shards_slot_lapses_and_its_late_give_back_takes_no_other(table: Any) -> None:
    shards(table, "dead", 1)
    shards(table, "next", 2)
    clock = Clock()
    slots = ShardSlots(table, SlotPolicy(cap=1), clock=clock)
    assert slots.take("dead", 0).taken

    clock.now += (WINDOWS - 1) * WINDOW_S
    assert not slots.take("next", 0).taken
    clock.now += 2 * WINDOW_S
    assert slots.take("next", 0).taken

    # the dead shard's hour left the ring: its give-back gives back nothing of the live one's
    assert slots.give_back("dead", 0)
    assert inflight(table) == 1
    assert not slots.take("next", 1).taken


def test_a_failed_or_cancelled_job_gives_back_the_slots_its_stopped_shards_held(table: Any) -> None:
    shards(table, "job", 3)
    slots = ShardSlots(table, SlotPolicy(cap=3), clock=Clock())
    windows = {s: slots.take("job", s).window for s in (0, 2)}
    rows = [
        ShardRow(
            shard=s,
            lines=1,
            requests=1,
            mode="direct",
            status="pending",
            done=0,
            failed=0,
            runs=0,
            expires_at=0,
            slot_window=windows.get(s),
        )
        for s in range(3)
    ]

    assert give_back_held(table, "job", rows) == 2
    assert inflight(table) == 0 and holding(table, "job", 3) == []


def test_a_shard_that_waited_its_longest_fails_naming_the_cap(table: Any) -> None:
    shards(table, "first", 1)
    shards(table, "second", 1)
    policy = SlotPolicy(cap=1, first_wait_s=5, max_wait_s=60, max_wait_total_s=3600)
    slots = ShardSlots(table, policy, clock=Clock())
    assert slots.take("first", 0).taken
    waits = next(n for n in range(1000) if waited_s(policy, n) >= policy.max_wait_total_s)

    assert not slots.take("second", 0, waits=waits - 1).taken
    with pytest.raises(NoSlot, match="max_shards_in_flight"):
        slots.take("second", 0, waits=waits)


def test_without_a_cap_a_shard_takes_its_slot_with_no_call(table: Any) -> None:
    slots = ShardSlots(table, SlotPolicy(cap=0), clock=Clock())
    assert slots.take("job", 0).taken and not slots.give_back("job", 0)
    assert "Item" not in table.get_item(Key=SLOTS_KEY)


def test_waits_double_to_the_most_jittered_down_to_half() -> None:
    policy = SlotPolicy(cap=1, first_wait_s=5, max_wait_s=60)
    assert [wait_s(policy, n, lambda: 1.0) for n in range(6)] == [5, 10, 20, 40, 60, 60]
    assert [wait_s(policy, n, lambda: 0.0) for n in range(6)] == [3, 5, 10, 20, 30, 30]
    # twelve hours of waits: about 720, nine history events each, well within a child's 25,000
    assert next(n for n in range(10_000) if waited_s(policy, n) >= 12 * 3600) * 9 < 10_000


def test_the_ring_drops_only_the_hours_that_left_it() -> None:
    # a slot taken in hour 90 and one in hour 100
    taken = tuple(1 if i in (90 % WINDOWS, 100 % WINDOWS) else 0 for i in range(WINDOWS))
    slots = Slots(window=100, inflight=2, taken=taken)
    assert moved_on(slots, 100) == slots
    assert moved_on(slots, 90 + WINDOWS - 1).inflight == 2
    assert moved_on(slots, 90 + WINDOWS).inflight == 1
    assert moved_on(slots, 100 + WINDOWS).inflight == 0
    assert moved_on(slots, 100 + 10 * WINDOWS) == Slots.empty(100 + 10 * WINDOWS)
