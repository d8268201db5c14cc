"""The Batch queue's slots (issue 30): admission under the limit, loans between slots, holds that
lapse, lost races that back off, releases that count once, and dead shards' holds reconciled."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from moto import mock_aws
from sluice.contract import create_table_request
from sluice.core.retry import TABLE_RETRY, table_retry_delay_s
from sluice.limits.batch_queue import (
    HOLD_GRACE_S,
    HOLD_MAX_S,
    MAX_RACES,
    QUEUE_SLOTS,
    RECONCILE_EVERY_S,
    WINDOW_S,
    WINDOWS,
    Hold,
    NoRoom,
    Room,
    Slot,
    SlotWrite,
    caught_up,
    lapsing,
    listed_batches,
    plan,
    share,
    window_of,
)
from sluice.limits.batch_queue_table import QueueTable, slot_key
from sluice.providers.openai.batch import batch_status

QUEUE = "LIMIT#0123456789abcdef#gpt-4o-mini"
NOW = 1_750_000_000.0


def full(limit: int, window: int) -> dict[int, Slot | None]:
    return {i: Slot(share(i, limit), limit, window, (0,) * WINDOWS) for i in range(QUEUE_SLOTS)}


def hold(shard: int, part: int = 0, attempt: int = 1, job: str = "j") -> Hold:
    return Hold(job, shard, part, attempt)


def loans(room: Room | NoRoom) -> list[tuple[int, int]]:
    """The slots a reservation borrows from, and how much from each."""
    assert isinstance(room, Room)
    return [(write.slot, write.tokens) for write in room.writes[:-1]]


# ---- the arithmetic


def test_a_hold_takes_from_its_home_slot_and_borrows_what_it_lacks_from_the_others() -> None:
    window = window_of(NOW)
    slots = full(800, window)
    one = hold(0)
    home = one.home
    fits = plan(slots, one, 100, 800, window)
    assert fits == Room(take=100, writes=(SlotWrite(home, 100, window),))
    # more than the home slot's share: the rest is lent by other slots, none of it twice
    big = plan(slots, one, 350, 800, window)
    assert isinstance(big, Room) and big.take == 350
    assert sum(tokens for _, tokens in loans(big)) == 250 and home not in dict(loans(big))
    assert big.home == SlotWrite(home, 100, window)
    # what the other slots hold leaves less to lend: 700 spare of 1,600 here, so 701 does not fit
    busy = {i: Slot(100, 1600, window, (0,) * WINDOWS) for i in range(QUEUE_SLOTS)}
    busy[home] = Slot(0, 1600, window, (0,) * WINDOWS)
    assert plan(busy, one, 701, 1600, window) == NoRoom(enqueued=900)
    lent = plan(busy, one, 700, 1600, window)
    assert sorted(t for _, t in loans(lent)) == [100] * 7


def test_admission_fits_the_limit_and_a_lone_giant_goes_only_on_an_empty_queue() -> None:
    window = window_of(NOW)
    slots = full(800, window)
    one, other = hold(0), hold(1)
    # 700 of 800 held (on `other`'s home and, lent, elsewhere): 100 spare
    taken = dict(slots)
    left = 100
    for i in range(QUEUE_SLOTS):
        keep = min(share(i, 800), left)
        left -= keep
        taken[i] = Slot(keep, 800, window, (0,) * WINDOWS)
    assert plan(taken, one, 101, 800, window) == NoRoom(enqueued=700)
    assert isinstance(plan(taken, one, 100, 800, window), Room)
    # a part over the whole limit takes all of it, and only when nothing else is held
    assert plan(taken, other, 5_000, 800, window) == NoRoom(enqueued=700)
    giant = plan(slots, other, 5_000, 800, window)
    assert isinstance(giant, Room) and giant.take == 800
    assert sum(t for _, t in loans(giant)) == 800 - share(other.home, 800)


def test_a_slot_moves_on_by_the_hour_and_returns_what_was_taken_26_windows_ago() -> None:
    assert lapsing(10, 10) == () and lapsing(10, 9) == ()
    assert lapsing(10, 12) == (11 % WINDOWS, 12 % WINDOWS)
    assert lapsing(10, 10 + WINDOWS + 5) == tuple(range(WINDOWS))
    window = 1_000
    counts = tuple(10 * (i + 1) for i in range(WINDOWS))
    slot = Slot(100, 800, window, counts)
    # the same window and limit: nothing to write
    assert caught_up(slot, 0, 800, window) == (slot, None)
    # two hours on: the two oldest windows' takes come back
    later, write = caught_up(slot, 0, 800, window + 2)
    back = counts[(window + 1) % WINDOWS] + counts[(window + 2) % WINDOWS]
    assert write is not None and write.delta == back and later.spare == 100 + back and later.window == window + 2
    # a slot a clock ahead of ours moved on is current: it is not moved back
    assert caught_up(Slot(100, 800, window + 1, counts), 0, 800, window) == (Slot(100, 800, window + 1, counts), None)
    # a new limit changes the slot's share by the difference, whatever is held
    _, lowered = caught_up(slot, 0, 400, window)
    assert lowered is not None and lowered.after.spare == 100 + share(0, 400) - share(0, 800)


def test_a_slot_that_owes_tokens_after_the_limit_shrank_is_paid_by_the_others() -> None:
    window = window_of(NOW)
    one = hold(0)
    slots = full(800, window)
    slots[one.home] = Slot(-50, 800, window, (0,) * WINDOWS)
    found = plan(slots, one, 30, 800, window)
    assert sum(t for _, t in loans(found)) == 80 and isinstance(found, Room) and found.home.tokens == -50


def test_the_providers_batches_are_read_by_their_metadata() -> None:
    def batch(status: str, ended: int | None, metadata: dict[str, str]) -> Any:
        return batch_status(SimpleNamespace(status=status, created_at=10, completed_at=ended, metadata=metadata))

    listed = listed_batches(
        [
            batch("in_progress", None, {"job": "j", "shard": "0", "part": "1", "try": "2"}),
            batch("completed", 50, {"job": "j", "shard": "1", "part": "0"}),
            batch("validating", None, {"job": "elsewhere", "shard": "x", "part": "0"}),
            batch("completed", 50, {}),
        ]
    )
    assert set(listed) == {("j", 0), ("j", 1)}
    assert listed[("j", 0)][(1, 2)].active and listed[("j", 0)][(1, 2)].ended == 10
    assert not listed[("j", 1)][(0, 1)].active and listed[("j", 1)][(0, 1)].ended == 50


# ---- the table


@pytest.fixture
def table() -> Iterator[Any]:
    with mock_aws():
        boto3.client("dynamodb", region_name="us-east-1").create_table(**create_table_request("jobs"))
        yield boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spare(queue: QueueTable, limit: int = 800, now: float = NOW) -> int:
    """The queue's spare tokens as a reservation at `now` sees them: a slot not made yet holds its
    share, and one not written since a window lapsed has that window's tokens back."""
    slots, _ = queue.slots(QUEUE)
    return sum(caught_up(s, i, limit, window_of(now))[0].spare for i, s in slots.items())


def test_a_reservation_writes_its_home_slot_once_and_a_retry_finds_its_hold(table: Any) -> None:
    clock = Clock()
    queue = QueueTable(table, clock=clock)
    first, second = hold(0), hold(0, part=1)
    home = slot_key(QUEUE, first.home)["pk"]
    # the first use makes the home slot with the hold taken, then the seven others; the shard's
    # hold row is its own
    assert queue.reserve(QUEUE, first, 60, 800).granted
    assert queue.writes[home] == 1 and sum(queue.writes.values()) == 1 + 7 + 1
    assert all(slot is not None for slot in queue.slots(QUEUE)[0].values())
    queue.writes.clear()
    assert queue.reserve(QUEUE, second, 40, 800).granted
    assert queue.writes == {home: 1, "JOB#j#00000": 1}
    assert spare(queue) == 700
    queue.writes.clear()
    clock.now += 5
    again = queue.reserve(QUEUE, first, 60, 800)
    assert again.granted and again.held_since == pytest.approx(NOW, abs=0.01)
    # asking again reads the shard's own partition and writes nothing
    assert not queue.writes
    assert queue.release(first) is True
    assert queue.release(first) is False  # twice gives back once
    assert queue.writes == {home: 1, "JOB#j#00000": 2}
    assert spare(queue) == 760
    assert queue.release(second) is True and spare(queue) == 800


def test_no_more_than_the_limit_is_ever_held_whatever_the_shards_interleave(table: Any) -> None:
    lock = threading.Lock()

    class OneCallAtATime:
        """The table as DynamoDB serves one item: moto applies a conditional update in steps."""

        def __init__(self, inner: Any) -> None:
            self.name = inner.name
            self.meta = SimpleNamespace(
                client=SimpleNamespace(batch_get_item=self._serial(inner.meta.client.batch_get_item))
            )
            for call in ("update_item", "get_item", "query"):
                setattr(self, call, self._serial(getattr(inner, call)))

        @staticmethod
        def _serial(call: Any) -> Any:
            def run(**kwargs: Any) -> Any:
                with lock:
                    return call(**kwargs)

            return run

    limit = 400
    held = {"now": 0, "peak": 0, "granted": 0}
    tally = threading.Lock()

    def shard(number: int) -> None:
        """Reserve part after part, keeping them, until the queue refuses one; then let all go."""
        rand = random.Random(number)
        queue = QueueTable(OneCallAtATime(table), sleep=lambda s: None, rand=rand.random)
        mine: list[tuple[Hold, int]] = []
        for part in range(6):
            tokens = rand.randint(40, 120)
            one = hold(number, part)
            if queue.reserve(QUEUE, one, tokens, limit).granted:
                mine.append((one, tokens))
                with tally:
                    held["now"] += tokens
                    held["granted"] += 1
                    held["peak"] = max(held["peak"], held["now"])
                continue
            with tally:
                held["now"] -= sum(tokens for _, tokens in mine)
            for one, _ in mine:
                queue.release(one)
            mine.clear()
        with tally:
            held["now"] -= sum(tokens for _, tokens in mine)
        for one, _ in mine:
            queue.release(one)

    threads = [threading.Thread(target=shard, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert held["granted"] > 6 and limit / 2 < held["peak"] <= limit
    # every token came back: the slots hold the limit again
    assert spare(QueueTable(table), limit) == limit


def test_a_lost_race_backs_off_with_jitter_before_the_slots_are_read_again(table: Any) -> None:
    class Contended(QueueTable):
        """A rival shard's update comes first the first `losses` times."""

        def __init__(self, losses: int) -> None:
            self.slept: list[float] = []
            super().__init__(table, sleep=self.slept.append, rand=lambda: 1.0)
            self.losses = losses

        def _write(self, queue: str, write: SlotWrite, limit: int) -> bool:
            if self.losses:
                self.losses -= 1
                return False
            return super()._write(queue, write, limit)

    queue = Contended(losses=3)
    assert queue.reserve(QUEUE, hold(0), 10, 800).granted
    assert queue.slept == [table_retry_delay_s(n, lambda: 1.0) for n in (1, 2, 3)]
    assert 0 < queue.slept[0] < queue.slept[1] < queue.slept[2] <= TABLE_RETRY.max_delay_s
    # one that loses every race gives up without a last, useless wait, holding nothing
    hopeless = Contended(losses=100)
    assert not hopeless.reserve(QUEUE, hold(1), 10, 800).granted
    assert len(hopeless.slept) == MAX_RACES - 1
    assert hopeless.held(hold(1)) is None


def test_a_hold_nobody_releases_lapses_after_25_to_26_hours_and_its_late_release_gives_nothing(
    table: Any,
) -> None:
    clock = Clock(window_of(NOW) * WINDOW_S + WINDOW_S - 1)
    queue = QueueTable(table, clock=clock)
    taken_at = clock.now
    dead, alive = hold(0), hold(1)
    assert queue.reserve(QUEUE, dead, 800, 800).granted
    clock.now = taken_at + HOLD_MAX_S - WINDOW_S
    assert not queue.reserve(QUEUE, alive, 100, 800).granted
    # 25 hours and a second on (its window was in its last second): back in the queue
    clock.now = taken_at + HOLD_MAX_S + 1
    assert queue.reserve(QUEUE, alive, 100, 800).granted
    # the dead shard's release, come late, gives nothing back twice
    queue.release(dead)
    queue.release(alive)
    assert spare(queue, now=clock.now) == 800
    assert taken_at + (WINDOWS - 1) * WINDOW_S < clock.now <= taken_at + WINDOWS * WINDOW_S


def test_a_dead_shards_holds_are_released_unless_the_provider_still_runs_their_batch(table: Any) -> None:
    clock = Clock()
    queue = QueueTable(table, clock=clock)
    old = NOW - HOLD_GRACE_S - 60
    clock.now = old
    ended, never_created, running = hold(0, 0), hold(0, 1), hold(1, 0)
    for one in (ended, never_created, running):
        assert queue.reserve(QUEUE, one, 100, 800).granted
    clock.now = NOW
    young = hold(0, 2)
    assert queue.reserve(QUEUE, young, 100, 800).granted

    def batch(status: str, part: int, shard: int, ended_at: float | None = None) -> Any:
        metadata = {"job": "j", "shard": str(shard), "part": str(part)}
        namespace = SimpleNamespace(status=status, created_at=int(old), completed_at=ended_at, metadata=metadata)
        return batch_status(namespace)

    listed = listed_batches([batch("completed", 0, 0, old + 1), batch("in_progress", 0, 1)])
    assert queue.forget(QUEUE, listed) == 2
    left = {row.hold for row in queue.unreleased([("j", 0), ("j", 1)])}
    # the running batch's hold stays, and so does the young one (its batch may be being created)
    assert left == {running, young}
    assert spare(queue) == 800 - 200


def test_one_shard_of_the_key_reconciles_at_a_time(table: Any) -> None:
    clock = Clock()
    queue = QueueTable(table, clock=clock)
    assert queue.reserve(QUEUE, hold(0), 800, 800).granted
    refused = queue.reserve(QUEUE, hold(1), 1, 800)
    assert not refused.granted and refused.enqueued == 800 and refused.checked == 0
    assert queue.claim_reconcile(QUEUE, refused.checked)
    # the other shards that found no room meanwhile read the claim and leave it
    assert not queue.claim_reconcile(QUEUE, refused.checked)
    later = queue.reserve(QUEUE, hold(2), 1, 800)
    assert later.checked == NOW and not queue.claim_reconcile(QUEUE, later.checked)
    clock.now += RECONCILE_EVERY_S
    assert queue.claim_reconcile(QUEUE, later.checked)


def test_tokens_borrowed_for_a_hold_that_lost_its_race_stay_in_the_queue(table: Any) -> None:
    class LosesAtHome(QueueTable):
        """Another shard takes from the home slot just before the first borrowing hold does."""

        lost_once = False

        def _write(self, queue: str, write: SlotWrite, limit: int) -> bool:
            if write.slot == hold(0).home and not self.lost_once:
                self.lost_once = True
                return False
            return super()._write(queue, write, limit)

    queue = LosesAtHome(table, clock=Clock(), sleep=lambda s: None)
    one = hold(0)
    # 300 of 800: the home slot's 100 and 200 borrowed; the first try loses at home and gives
    # what it borrowed back, and the second try borrows again
    queue.reserve(QUEUE, one, 300, 800)
    assert queue.lost_once and spare(queue) == 500
    assert queue.release(one) and spare(queue) == 800


def test_a_new_limit_counts_the_holds_already_taken(table: Any) -> None:
    queue = QueueTable(table, clock=Clock())
    assert queue.reserve(QUEUE, hold(0), 300, 800).granted
    # the limit halved (a redeployed setting): 300 of the new 400 are held already
    refused = queue.reserve(QUEUE, hold(1), 150, 400)
    assert not refused.granted and refused.enqueued == 300
    assert queue.reserve(QUEUE, hold(1), 100, 400).granted
    assert queue.release(hold(0)) and queue.release(hold(1))
    assert spare(queue, 400) == 400
