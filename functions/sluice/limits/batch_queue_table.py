"""The Batch queue's reads and writes (`batch_queue` has the design and its figures).

Every write to a slot is one conditional UpdateItem that moves `spare` and one window's counter
together (or moves the slot on to the current window, conditional on what was read), so a write
that loses its race changes nothing. A hold row is written after its tokens are taken and marked
released before they go back: a crash between the two leaves tokens held until their window
lapses, never more admitted than the limit.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from boto3.dynamodb.conditions import Key

from sluice.contract import PARTITION_KEY, SORT_KEY, causes
from sluice.core.retry import table_retry_delay_s
from sluice.limits.batch_queue import (
    HOLD_MAX_S,
    MAX_RACES,
    NO_SLOT,
    QUEUE_SLOTS,
    QUEUE_SORT_KEY,
    QUEUE_TTL_S,
    SLOT_NAMES,
    WINDOWS,
    Hold,
    Listed,
    NoRoom,
    Room,
    Slot,
    SlotWrite,
    dead,
    plan,
    reconcile_due,
    share,
    suspects,
    window_of,
)
from sluice.store.keys import HOLD_PREFIX, hold_key, shard_partition
from sluice.store.rows import Rows, conditional

# the slot that records when the key's queue was last reconciled
CHECK_SLOT = 0


def slot_key(queue: str, slot: int) -> dict[str, str]:
    return {PARTITION_KEY: f"{queue}#{SLOT_NAMES[slot]}", SORT_KEY: QUEUE_SORT_KEY}


def _counter(index: int) -> str:
    return f"k{index:02d}"


def read_slot(item: Mapping[str, Any]) -> Slot | None:
    if "win" not in item:
        # only the reconcile stamp: the slot itself was never made
        return None
    return Slot(
        spare=int(item["spare"]),
        limit=int(item["lim"]),
        window=int(item["win"]),
        taken=tuple(int(item.get(_counter(i), 0)) for i in range(WINDOWS)),
    )


@dataclass(frozen=True)
class HoldRow:
    """A hold as its shard's partition records it: the tokens it took from which slot and window."""

    hold: Hold
    queue: str
    slot: int
    window: int
    tokens: int
    since: float
    released: bool

    @classmethod
    def of(cls, hold: Hold, item: Mapping[str, Any]) -> HoldRow:
        return cls(
            hold=hold,
            queue=str(item["queue"]),
            slot=int(item["slot"]),
            window=int(item["win"]),
            tokens=int(item["tokens"]),
            since=float(item["since"]),
            released="released" in item,
        )


@dataclass(frozen=True)
class Reservation:
    """`granted`, or the tokens already enqueued when there was no room, and when the queue was
    last reconciled (`checked`, 0 = never). `held_since` is when an earlier attempt took this very
    hold: it may have created the batch before it died."""

    granted: bool
    enqueued: int = 0
    held_since: float | None = None
    checked: float = 0.0


class QueueTable(Rows):
    """The queue's slot items and the hold rows; `table` is a boto3 DynamoDB Table resource.
    `reads` and `writes` count the calls by partition key."""

    def __init__(
        self,
        table: Any,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        # the queue's rows carry their own expiry (a hold's longest life and a day)
        super().__init__(table, ttl_days=0, clock=clock, sleep=sleep, rand=rand)
        self.reads: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()

    def _expires(self) -> int:
        return int(self._clock()) + HOLD_MAX_S + QUEUE_TTL_S

    @causes.under(causes.BATCH_SUBMIT, causes.BATCH_COLLECT, causes.SHARD_FAILED)
    def _update(self, key: dict[str, str], **kwargs: Any) -> dict[str, Any] | None:
        """One conditional update: its attributes (`ReturnValues`), or None when its condition failed."""
        self.writes[key[PARTITION_KEY]] += 1
        return conditional(self._table.update_item, Key=key, **kwargs)

    # ---- the slots

    @causes.under(causes.BATCH_SUBMIT, causes.FIRST)
    def slots(self, queue: str, *, consistent: bool = False) -> tuple[dict[int, Slot | None], float]:
        """Every slot of `queue` (None: not made yet) and when the queue was last reconciled."""
        keys = [slot_key(queue, index) for index in range(QUEUE_SLOTS)]
        for key in keys:
            self.reads[key[PARTITION_KEY]] += 1
        items = {str(item[PARTITION_KEY]): item for item in self._batch_get(keys, consistent=consistent)}
        found = {index: read_slot(items.get(key[PARTITION_KEY], {})) for index, key in enumerate(keys)}
        checked = float(items.get(keys[CHECK_SLOT][PARTITION_KEY], {}).get("checked", 0))
        return found, checked

    def _write(self, queue: str, write: SlotWrite, limit: int) -> bool:
        """A slot's one write in a reservation: `write.tokens` taken out of its spare ones if it has
        them, the slot made with its share if nobody has yet, or first moved on to the current
        window and limit if it must be."""
        counter = _counter(write.window % WINDOWS)
        values: dict[str, Any] = {":tokens": write.tokens, ":lim": limit, ":win": write.window, ":exp": self._expires()}
        catch_up = write.catch_up
        if catch_up is None or catch_up.before is None:
            # made by this write or taken from as it is: the same update, so a slot made a moment
            # ago by another shard is no race lost
            update = (
                "SET spare = if_not_exists(spare, :share) - :tokens, lim = if_not_exists(lim, :lim),"
                f" win = if_not_exists(win, :win), {counter} = if_not_exists({counter}, :zero) + :tokens,"
                " expires_at = :exp"
            )
            condition = (
                "(attribute_not_exists(win) OR (win = :win AND lim = :lim))"
                " AND (attribute_not_exists(spare) OR spare >= :tokens)"
            )
            values.update({":share": share(write.slot, limit), ":zero": 0})
        else:
            # moved on: the lapsed windows' tokens come back in `delta`, as long as nobody changed
            # their counters since they were read (a release into one of them would count twice)
            before = catch_up.before
            sets = ["spare = spare + :delta", "lim = :lim", "win = :win", "expires_at = :exp"]
            checks = ["win = :was", "lim = :was_lim", "spare >= :need"]
            for i in catch_up.zeroed:
                name = _counter(i)
                if name != counter:
                    sets.append(f"{name} = :zero")
                checks.append(f"(attribute_not_exists({name}) OR {name} = :k{i})")
                values[f":k{i}"] = before.taken[i]
            if write.window % WINDOWS in catch_up.zeroed:
                sets.append(f"{counter} = :tokens")
            else:
                sets.append(f"{counter} = if_not_exists({counter}, :zero) + :tokens")
            update = "SET " + ", ".join(sets)
            if ":zero" in update:
                values[":zero"] = 0
            condition = " AND ".join(checks)
            values.update(
                {
                    ":delta": catch_up.delta - write.tokens,
                    ":need": write.tokens - catch_up.delta,
                    ":was": before.window,
                    ":was_lim": before.limit,
                }
            )
        answer = self._update(
            slot_key(queue, write.slot),
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeValues=values,
        )
        return answer is not None

    def _make(self, queue: str, slot: int, limit: int, window: int) -> bool:
        """Make a slot nobody has used yet, with its share of the limit; False if it was made."""
        answer = self._update(
            slot_key(queue, slot),
            UpdateExpression=(
                "SET spare = if_not_exists(spare, :share), lim = if_not_exists(lim, :lim),"
                " win = if_not_exists(win, :win), expires_at = if_not_exists(expires_at, :exp)"
            ),
            ExpressionAttributeValues={
                ":share": share(slot, limit),
                ":lim": limit,
                ":win": window,
                ":exp": self._expires(),
            },
            ReturnValues="UPDATED_OLD",
        )
        return answer is not None and "win" not in answer.get("Attributes", {})

    def _give(self, queue: str, slot: int, tokens: int, window: int) -> bool:
        """Put back `tokens` taken in `window`, unless that window has lapsed: then the slot
        returned them already."""
        counter = _counter(window % WINDOWS)
        return (
            self._update(
                slot_key(queue, slot),
                UpdateExpression=f"ADD spare :tokens, {counter} :minus SET expires_at = :exp",
                ConditionExpression="win BETWEEN :win AND :last",
                ExpressionAttributeValues={
                    ":tokens": tokens,
                    ":minus": -tokens,
                    ":win": window,
                    ":last": window + WINDOWS - 1,
                    ":exp": self._expires(),
                },
            )
            is not None
        )

    def _carry_out(self, queue: str, room: Room, limit: int) -> bool:
        """Take the loans from the lending slots, then the hold from the home slot with them, one
        write a slot; False at the first write another shard's came before, the loans taken so
        far given back."""
        taken: list[SlotWrite] = []
        for write in room.writes:
            if not self._write(queue, write, limit):
                for lent in taken:
                    self._give(queue, lent.slot, lent.tokens, lent.window)
                return False
            taken.append(write)
        for slot in room.missing:
            # every slot exists from the queue's first reservations on (one nobody made holds its
            # share all the same); the first one found made means another shard is making them
            with causes.because(causes.FIRST):
                made = self._make(queue, slot, limit, room.home.window)
            if not made:
                break
        return True

    def lost(self, attempt: int) -> None:
        """After `attempt` lost races: wait before reading again, so shards that collided do not
        read and write again in step."""
        self._sleep(table_retry_delay_s(attempt, self._rand))

    # ---- the hold rows, each on its shard's own partition

    @causes.under(causes.BATCH_SUBMIT)
    def held(self, hold: Hold) -> HoldRow | None:
        key = hold_key(hold.job, hold.shard, hold.part, hold.attempt)
        self.reads[key[PARTITION_KEY]] += 1
        item = self._table.get_item(Key=key, ConsistentRead=True).get("Item")
        return HoldRow.of(hold, item) if item is not None else None

    def _record(self, hold: Hold, queue: str, slot: int, window: int, tokens: int, since: float) -> None:
        key = hold_key(hold.job, hold.shard, hold.part, hold.attempt)
        self._update(
            key,
            UpdateExpression=(
                "SET #q = :queue, slot = :slot, win = :win, tokens = :tokens, since = :since, expires_at = :exp"
                " REMOVE released"
            ),
            ExpressionAttributeNames={"#q": "queue"},
            ExpressionAttributeValues={
                ":queue": queue,
                ":slot": slot,
                ":win": window,
                ":tokens": tokens,
                ":since": Decimal(repr(round(since, 3))),
                ":exp": self._expires(),
            },
        )

    @causes.under(causes.BATCH_SUBMIT)
    def _holds_of(self, job: str, shard: int) -> list[HoldRow]:
        """The holds recorded on one shard's partition, released or not."""
        pk = shard_partition(job, shard)
        self.reads[pk] += 1
        answer = self._table.query(
            KeyConditionExpression=Key(PARTITION_KEY).eq(pk) & Key(SORT_KEY).begins_with(HOLD_PREFIX)
        )
        rows = []
        for item in answer.get("Items", []):
            part, attempt = str(item[SORT_KEY]).removeprefix(HOLD_PREFIX).split("#")
            rows.append(HoldRow.of(Hold(job, shard, int(part), int(attempt)), item))
        return rows

    # ---- what the shards do

    def reserve(self, queue: str, hold: Hold, tokens: int, limit: int) -> Reservation:
        """Hold `tokens` for `hold` on `queue` if they fit under `limit` (0 = none)."""
        now = self._clock()
        row = self.held(hold)
        if row is not None and not row.released:
            if row.since + HOLD_MAX_S > now:
                return Reservation(True, held_since=row.since)
            # lapsed: its tokens are back in the queue, or go back now
            self.release(hold)
        if limit <= 0:
            self._record(hold, queue, NO_SLOT, 0, 0, now)
            return Reservation(True)
        checked = 0.0
        for attempt in range(1, MAX_RACES + 1):
            # a race lost on what an eventually consistent read showed is read again as it is
            slots, checked = self.slots(queue, consistent=attempt > 1)
            found = plan(slots, hold, tokens, limit, window_of(now))
            if isinstance(found, NoRoom):
                return Reservation(False, enqueued=found.enqueued, checked=checked)
            if self._carry_out(queue, found, limit):
                self._record(hold, queue, hold.home, found.home.window, found.take, now)
                return Reservation(True)
            if attempt < MAX_RACES:
                self.lost(attempt)
            now = self._clock()
        return Reservation(False, enqueued=limit, checked=checked)

    def release(self, hold: Hold) -> bool:
        """Give the hold's tokens back, once however often it is asked; False if it was not held."""
        key = hold_key(hold.job, hold.shard, hold.part, hold.attempt)
        answer = self._update(
            key,
            UpdateExpression="SET released = :now",
            ConditionExpression="attribute_exists(since) AND attribute_not_exists(released)",
            ExpressionAttributeValues={":now": Decimal(repr(round(self._clock(), 3)))},
            ReturnValues="ALL_NEW",
        )
        if answer is None:
            return False
        row = HoldRow.of(hold, answer["Attributes"])
        if row.slot != NO_SLOT:
            self._give(row.queue, row.slot, row.tokens, row.window)
        return True

    def claim_reconcile(self, queue: str, checked: float) -> bool:
        """Whether this shard is the one to reconcile `queue` now (see `batch_queue.reconcile_due`)."""
        now = self._clock()
        if not reconcile_due(checked, now):
            return False
        return (
            self._update(
                slot_key(queue, CHECK_SLOT),
                UpdateExpression="SET checked = :now, expires_at = if_not_exists(expires_at, :exp)",
                ConditionExpression="attribute_not_exists(checked) OR checked = :seen",
                ExpressionAttributeValues={
                    ":now": Decimal(repr(round(now, 3))),
                    ":seen": Decimal(repr(round(checked, 3))),
                    ":exp": self._expires(),
                },
            )
            is not None
        )

    def forget(self, queue: str, listed: Mapping[tuple[str, int], Mapping[tuple[int, int], Listed]]) -> int:
        """Release the holds on `queue` that belong to nobody (`batch_queue.dead`), looking only at
        the shards that may have died (`batch_queue.suspects`); how many went."""
        now = self._clock()
        freed = 0
        for job, shard in suspects(listed, now):
            batches = listed[(job, shard)]
            for row in self._holds_of(job, shard):
                if row.released or row.queue != queue:
                    continue
                if dead(row.since, batches.get((row.hold.part, row.hold.attempt)), now) and self.release(row.hold):
                    freed += 1
        return freed

    def unreleased(self, shards: Iterable[tuple[str, int]]) -> list[HoldRow]:
        """The holds of these shards not yet released (tests, benches)."""
        return [row for job, shard in shards for row in self._holds_of(job, shard) if not row.released]
