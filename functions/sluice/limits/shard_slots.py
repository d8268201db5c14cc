"""The environment's cap on shards in flight across all its jobs: a slot a shard holds from its
first step to its end, so that jobs at once queue for Lambda's concurrency rather than fail each
other.

A job's Map runs at most its `map_concurrency` shards at once, but nothing in Step Functions caps
them across executions: without a cap, jobs at once would ask Lambda for more concurrency than
the account has, and a step throttled for its whole retry run (about 73 minutes) fails its shard.
So each shard takes a slot before it runs (`max_shards_in_flight` of them) and waits in the
workflow, not in a Lambda, while none is free.

**The item.** One item of the jobs table, `ACCOUNT#shards` / `SLOTS`: `inflight`, the slots
held, and `WINDOWS` hourly counters `k00`.. of the slots taken in each hour, a ring whose current
hour is `win`. `inflight` is always the sum of the live counters, and every write keeps it so in
one update: a take is `inflight + 1` and its hour's counter + 1 on condition that `inflight` is
below the cap and the hour is the one read, so two shards racing for the last slot cannot both
have it; a give-back is - 1 on both, on condition that its hour is still in the ring.

**Lapse.** A shard that dies without giving its slot back (its execution stopped or timed out,
a crash between two writes) must not hold it for ever: the first take in a new hour moves the
ring on and drops the counters `WINDOWS` hours old from `inflight`. A slot thus lapses 25 to 26
hours after it was taken, once a batch shard (its 24-hour completion window) has ended. A
slot is not renewed: a shard that runs longer than that stops counting, so the cap may be passed
by such shards until they end; a lapsed slot's give-back gives back nothing.

**The shard's hold.** The hour a shard took its slot in is on its own row (`slot_window` on
`JOB#<job>#<shard>` / `SHARD`), written after the take and removed before the give-back: a step
retried after its take finds the hold and gives the second take back, a give-back asked twice
gives back once, and MarkFailed and `sluice cancel` give back the slots of every shard of theirs
still holding one (their executions' children stop without reaching their own give-back).

**Figures.** A take is one strongly consistent read of the item (1 RCU) and, with room, one
write to it and one to the shard's row; a refused take only reads. A give-back is two writes. So
the item takes two writes per shard in its life, whatever its lines: the capacity check, which
counts them as once a run (an upper bound) in the opening wave of 20 shards a second, puts it at
50 WCU/s (5% of a partition's 1,000); 1,000 shards waiting read it at most every `first_wait_s`
to `max_wait_s`, at most 200 RCU/s (7% of 3,000).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.contract import PARTITION_KEY, SORT_KEY, causes
from sluice.contract.rows import ShardRow
from sluice.store.keys import shard_key
from sluice.store.rows import conditional

SLOTS_KEY = {PARTITION_KEY: "ACCOUNT#shards", SORT_KEY: "SLOTS"}
# the hold's attribute on the shard's row
HOLD_ATTRIBUTE = "slot_window"
WINDOW_S = 3600
# a slot lapses 25 to 26 hours after it was taken: past a batch's 24-hour completion window
WINDOWS = 26
# takes that lost the last slots' race to another shard, read again before the shard waits
MAX_RACES = 3


class NoSlot(RuntimeError):
    """A shard waited for a slot longer than `SlotPolicy.max_wait_total_s`: it ends failed, naming this."""


@dataclass(frozen=True)
class SlotPolicy:
    """The cap (`max_shards_in_flight`; 0: none) and how a shard waits for a slot in the workflow:
    `first_wait_s` doubling to `max_wait_s`, each jittered down to half, for at most
    `max_wait_total_s` in all. A wait is nine history events of the child's 25,000: 12 hours of
    waits at a minute are about 6,500."""

    cap: int
    first_wait_s: int = 5
    max_wait_s: int = 60
    max_wait_total_s: int = 12 * 3600


@dataclass(frozen=True)
class Slots:
    """The item: the current hour, the slots held, and the slots taken in each hour of the ring."""

    window: int
    inflight: int
    taken: tuple[int, ...]

    @classmethod
    def empty(cls, window: int) -> Slots:
        return cls(window, 0, (0,) * WINDOWS)


@dataclass(frozen=True)
class Taken:
    """What a take found: `taken` (in `window`), or no room, to ask again in `wait_s`."""

    taken: bool
    window: int = 0
    wait_s: int = 0


def window_of(now: float) -> int:
    return int(now // WINDOW_S)


def moved_on(slots: Slots, window: int) -> Slots:
    """The item in `window`: the counters of the hours that left the ring dropped from `inflight`."""
    if window <= slots.window:
        return slots
    taken = list(slots.taken)
    lapsed = 0
    for hour in range(slots.window + 1, min(window, slots.window + WINDOWS) + 1):
        lapsed += taken[hour % WINDOWS]
        taken[hour % WINDOWS] = 0
    return Slots(window, max(0, slots.inflight - lapsed), tuple(taken))


def _longest_s(policy: SlotPolicy, waits: int) -> int:
    return min(policy.max_wait_s, policy.first_wait_s << min(max(0, waits), 16))


def wait_s(policy: SlotPolicy, waits: int, rand: Callable[[], float] = random.random) -> int:
    """How long a shard refused `waits` times before waits now: doubling to the most, jittered
    down to half so that shards refused together do not all ask again together."""
    return max(1, math.ceil(_longest_s(policy, waits) * (0.5 + rand() / 2)))


def waited_s(policy: SlotPolicy, waits: int) -> int:
    """The most `waits` waits can have taken: each at most its unjittered length."""
    return sum(_longest_s(policy, n) for n in range(waits))


def _counter(index: int) -> str:
    """The attribute of the ring's counter `index`, the hour `index` mod `WINDOWS`."""
    return f"k{index % WINDOWS:02d}"


def read_slots(item: Mapping[str, Any]) -> Slots:
    return Slots(
        window=int(item["win"]),
        inflight=int(item["inflight"]),
        taken=tuple(int(item.get(_counter(i), 0)) for i in range(WINDOWS)),
    )


class ShardSlots:
    """The slots' item and the shards' holds; `table` is a boto3 DynamoDB Table resource."""

    def __init__(
        self,
        table: Any,
        policy: SlotPolicy,
        clock: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._table = table
        self.policy = policy
        self._clock = clock
        self._rand = rand

    def take(self, job_id: str, shard: int, *, waits: int = 0) -> Taken:
        """A slot for the shard, or how long to wait before asking again (`waits`: how often it
        was refused so far). Without a cap, a slot at once and no call. Raises NoSlot once the
        shard has waited its longest."""
        if self.policy.cap <= 0:
            return Taken(True)
        # the first look is the shard's; the others, the polls of a shard that waits
        again = causes.because(causes.SLOT_WAIT, period_s=float(_longest_s(self.policy, waits - 1)))
        with again if waits else causes.because(causes.SLOT):
            for _race in range(MAX_RACES):
                slots = self._read()
                if slots.inflight >= self.policy.cap:
                    break
                if self._took(slots):
                    return self._hold(job_id, shard, slots.window)
        waited = waited_s(self.policy, waits)
        if waited >= self.policy.max_wait_total_s:
            raise NoSlot(
                f"no slot among the environment's {self.policy.cap} shards in flight (max_shards_in_flight) "
                f"within {waited // 60} minutes: other jobs held them all"
            )
        return Taken(False, wait_s=wait_s(self.policy, waits, self._rand))

    def give_back(self, job_id: str, shard: int) -> bool:
        """The shard's slot given back, if it holds one (whether it did). Without a cap, no call."""
        if self.policy.cap <= 0:
            return False
        return _give_back(self._table, job_id, shard)

    def _read(self) -> Slots:
        """The item as of now, made or moved on to this hour first when it must be."""
        window = window_of(self._clock())
        item = self._table.get_item(Key=SLOTS_KEY, ConsistentRead=True).get("Item")
        if item is None:
            with causes.because(causes.SLOT_HOUR):
                conditional(
                    self._table.put_item,
                    Item={**SLOTS_KEY, "win": window, "inflight": 0},
                    ConditionExpression="attribute_not_exists(#pk)",
                    ExpressionAttributeNames={"#pk": PARTITION_KEY},
                )
            return Slots.empty(window)
        slots = read_slots(item)
        if window <= slots.window:
            return slots
        moved = moved_on(slots, window)
        changed = [i for i in range(WINDOWS) if moved.taken[i] != slots.taken[i]]
        with causes.because(causes.SLOT_HOUR):
            self._move_on(slots, moved, changed)
        return moved

    def _move_on(self, slots: Slots, moved: Slots, changed: list[int]) -> None:
        """The item moved on to `moved`'s hour, unless another take or a give-back came first."""
        names = {"#w": "win", "#n": "inflight", **{f"#k{i}": _counter(i) for i in changed}}
        zeroes = "".join(f", #k{i} = :zero" for i in changed)
        same = "".join(f" AND (attribute_not_exists(#k{i}) OR #k{i} = :k{i})" for i in changed)
        conditional(
            self._table.update_item,
            Key=SLOTS_KEY,
            UpdateExpression=f"SET #w = :w, #n = :n{zeroes}",
            # a give-back between the read and this write is counted again on the next read
            ConditionExpression=f"#w = :old AND #n = :was{same}",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues={
                ":w": moved.window,
                ":n": moved.inflight,
                ":old": slots.window,
                ":was": slots.inflight,
                **({":zero": 0} if changed else {}),
                **{f":k{i}": slots.taken[i] for i in changed},
            },
        )

    def _took(self, slots: Slots) -> bool:
        """One slot taken in the item's hour, unless another shard took the last one first."""
        return (
            conditional(
                self._table.update_item,
                Key=SLOTS_KEY,
                UpdateExpression="ADD #n :one, #k :one",
                ConditionExpression="#w = :w AND #n < :cap",
                ExpressionAttributeNames={"#n": "inflight", "#k": _counter(slots.window), "#w": "win"},
                ExpressionAttributeValues={":one": 1, ":w": slots.window, ":cap": self.policy.cap},
            )
            is not None
        )

    def _hold(self, job_id: str, shard: int, window: int) -> Taken:
        """The take recorded on the shard's row; a shard that holds one already (its step retried
        after it took) gives the new one back and keeps the one it holds."""
        held = conditional(
            self._table.update_item,
            Key=shard_key(job_id, shard),
            UpdateExpression="SET #h = :w",
            ConditionExpression="attribute_exists(#pk) AND attribute_not_exists(#h)",
            ExpressionAttributeNames={"#h": HOLD_ATTRIBUTE, "#pk": PARTITION_KEY},
            ExpressionAttributeValues={":w": window},
        )
        if held is None:
            _release(self._table, window)
        return Taken(True, window)


def _release(table: Any, window: int) -> None:
    """One slot taken in `window` given back, unless its hour has left the ring (it lapsed)."""
    conditional(
        table.update_item,
        Key=SLOTS_KEY,
        UpdateExpression="ADD #n :minus, #k :minus",
        ConditionExpression="#w < :end AND #n > :zero",
        ExpressionAttributeNames={"#n": "inflight", "#k": _counter(window), "#w": "win"},
        ExpressionAttributeValues={":minus": -1, ":end": window + WINDOWS, ":zero": 0},
    )


def _give_back(table: Any, job_id: str, shard: int) -> bool:
    """The hold removed from the shard's row, then its slot given back: asked twice, once."""
    with causes.because(causes.SLOT):
        answer = conditional(
            table.update_item,
            Key=shard_key(job_id, shard),
            UpdateExpression="REMOVE #h",
            ConditionExpression="attribute_exists(#h)",
            ExpressionAttributeNames={"#h": HOLD_ATTRIBUTE},
            ReturnValues="UPDATED_OLD",
        )
        if answer is None:
            return False
        _release(table, int(answer["Attributes"][HOLD_ATTRIBUTE]))
        return True


def give_back_held(table: Any, job_id: str, rows: Iterable[ShardRow]) -> int:
    """The slots of the job's shards whose `rows` say they hold one, given back: a failed or
    cancelled job's children stop without reaching their own give-back. How many were."""
    return sum(1 for row in rows if row.slot_window is not None and _give_back(table, job_id, row.shard))
