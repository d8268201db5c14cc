"""The provider's Batch queue limit, shared by every shard of every job on the same key (issues 16, 30).

A provider counts the input tokens of an organization's batches that are still validating, in
progress or finalizing, per model, and fails a new batch that would take the sum over its limit
(`token_limit_exceeded`). Shards cannot see each other's batches, so before creating one a shard
reserves its tokens in the jobs table. This module is the arithmetic; `batch_queue_table` the
reads and writes.

**Slots.** A key's queue for a model is eight slot items, `LIMIT#<key hash>#<model>#a` to `#h`
(sort key `QUEUE`; the shared rate limit's item is `LIMIT#<key hash>#<model>`), each holding its
share of the limit as `spare` tokens. Tokens only ever move between slots, so the holds together
never pass the limit however the shards interleave: a slot admits a hold only by taking it out of
its own `spare` in one conditional update (`SET spare = spare - t ... IF spare >= t`), never on a
count read earlier. A shard reserves on its home slot (a hash of job and shard). When the home
slot lacks room and the others have it, the shard first takes what it lacks out of the fullest of
them (a loan), and the home slot's update takes the loan in with the hold: one write on each slot
a reservation touches, which also makes the slot, or moves it on to the current hour, when it must
be. A lost race (another shard's update came first) gives back what it borrowed and is read again
after a jittered backoff (`retry.table_retry_delay_s`), at most `MAX_RACES` times. The queue's
first reservations make all eight slots (once each), so every slot exists while the key is used.

**Holds.** Each hold is a row on the shard's own partition, `JOB#<job>#<shard>` /
`HOLD#<part>#<attempt>`: the slot and window it took from, its tokens, since when, and whether
it was released. It is written after the slot's update and marked released before its tokens go
back, so a retried shard finds the hold it took (`held_since`: an earlier run may have created
the batch), a release gives back once however often it is asked, and a shard that dies between
the two writes leaves tokens held, never admits more than the limit.

**Lapse.** A slot counts what holds took, less what it was lent, in 26 hourly counters beside
`spare`; its first write in a new hour moves it on and returns the counters of the windows 26
hours old. So what nobody released (a hold, a loan, tokens a dead shard took but never recorded)
is back 25 to 26 hours after it was taken, once the provider's 24-hour completion window has
ended any batch it was for, and so is any miscount (an SDK retry of an applied update).

**Reconciling.** Sooner than that, when a reservation finds no room, one shard of the key (at
most every `RECONCILE_EVERY_S`, claimed on slot `a`) lists the key's batches of the last 26 hours
at the provider and, for each shard with a batch that ended over `HOLD_GRACE_S` ago, releases its
holds whose batch ended that long ago, or that no listed batch has and are older than the grace
(a shard that reserved several files and died after creating some). A hold whose shard created
no batch at all lapses.

**Figures.** A slot item is under 400 bytes whatever the shard count (about 90 when made, up to
about 350 with the model's name and all 26 counters): a write is 1 WCU, an eventually consistent
read 0.5 RCU. A reservation reads the eight slots in one BatchGetItem (0.5 RCU on each; strongly
consistent, 1 RCU, after a lost race) and writes its home slot once (1 WCU); a file larger than its
home slot's spare tokens first writes each slot it borrows from once (at most the seven others). A
release writes the hold's slot once; a refused reservation writes nothing. The hold row is one
strongly consistent read and one write on the shard's own partition, and a release one more: a
batch costs four writes, and one more for each slot it borrowed from. So S shards reserving in the
same second put about S/8 writes on each slot (a shard's first write falls on its home slot or on
the first slot it borrows from; a refused reservation writes none, and one that lost a race reads
again, strongly consistent, before it writes) and S reads: at 1,000 shards about 125 WCU (13% of a
partition's 1,000) and 500 RCU (17% of 3,000). The capacity model (bench/capacity.py), which puts
the busiest five seconds of every shard in flight on every slot, measures 400 WCU/s (40%) and 300
RCU/s (10%) a slot at 1,000 shards. The single item that held every hold before grew with them and
was read and rewritten whole by each: about 86 KB there, 51,600 WCU/s and 8,800 RCU/s.

A part larger than the whole limit (one huge row) goes when the queue is otherwise empty: it
takes every slot's tokens, so nothing goes beside it, and the provider's own count may be lower
than the estimate. The provider's `token_limit_exceeded` stays the backstop for batches the key
runs outside Sluice: the file waits and is created again (`providers.batch.QueueFull`, or a batch
whose status says `queue_full`).

Tokens are estimated as a quarter of the request body's bytes, rounded up. Tokenizers give about
four characters a token of English; counting the whole body (field names, quotes, the model) as
well as the prompt leans high, so an estimate under the limit is under it at the provider too.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sluice.contract.model import Request
from sluice.limits.local import limit_key
from sluice.providers.batch import BatchStatus

QUEUE_SORT_KEY = "QUEUE"
# the slot items' suffixes; letters, so that no two slots read as one key with a number in it
SLOT_NAMES = "abcdefgh"
QUEUE_SLOTS = len(SLOT_NAMES)
# a slot counts what holds took, and what it lent, per window of this long ...
WINDOW_S = 3600
# ... for this many windows: a hold lapses 25 to 26 hours after it was taken, once the provider's
# 24-hour completion window has ended its batch, with an hour more for clocks
WINDOWS = 26
HOLD_MAX_S = (WINDOWS - 1) * WINDOW_S
# a hold this young may belong to a batch being created right now: reconciling keeps it
HOLD_GRACE_S = 900.0
# one shard of the key reconciles at most this often
RECONCILE_EVERY_S = 300.0
# a slot outlives its last write by a day more than its longest hold
QUEUE_TTL_S = 86_400
# lost races before a reservation gives up for this round (the shard asks again later)
MAX_RACES = 8
# the slot of a hold that took nothing (a model without a limit)
NO_SLOT = -1


def estimate_tokens(request: Request) -> int:
    """Input tokens the provider will count for `request`: a quarter of its body's bytes, rounded up."""
    return max(1, -(-len(request.body or b"") // 4))


def queue_key(base_url: str, api_key: str, model: str | None) -> str:
    """The queue's name: the slots' partition keys add a slot's letter to it."""
    return limit_key(base_url, api_key, model or "")


def hold_ref(job_id: str, shard: int, part: int, attempt: int) -> str:
    return f"{job_id}#{shard}#{part}#{attempt}"


@dataclass(frozen=True)
class Hold:
    """One part's reservation: the shard's part at one attempt (a batch the provider refused for a
    full queue goes again under the next)."""

    job: str
    shard: int
    part: int
    attempt: int

    @property
    def ref(self) -> str:
        return hold_ref(self.job, self.shard, self.part, self.attempt)

    @property
    def home(self) -> int:
        """The slot the shard reserves on: every part of a shard the same one."""
        return zlib.crc32(f"{self.job}#{self.shard}".encode()) % QUEUE_SLOTS

    def lenders(self) -> list[int]:
        """The other slots, in the order this hold borrows from them: shards of the same home
        start at different slots, so their loans do not all fall on the same one."""
        others = [(self.home + n) % QUEUE_SLOTS for n in range(1, QUEUE_SLOTS)]
        start = zlib.crc32(self.ref.encode()) % len(others)
        return others[start:] + others[:start]


def share(slot: int, limit: int) -> int:
    """The tokens a slot holds when nothing is taken: the limit spread over the slots."""
    return limit // QUEUE_SLOTS + (1 if slot < limit % QUEUE_SLOTS else 0)


def window_of(now: float) -> int:
    return int(now // WINDOW_S)


def lapsing(since: int, until: int) -> tuple[int, ...]:
    """The counters a slot at window `since` returns to `spare` when it moves on to `until`: those
    of the windows `WINDOWS` or more older than `until`, which the new windows count in again."""
    if until <= since:
        return ()
    if until - since >= WINDOWS:
        return tuple(range(WINDOWS))
    return tuple(window % WINDOWS for window in range(since + 1, until + 1))


@dataclass(frozen=True)
class Slot:
    """One slot item: its spare tokens, the limit its share was worked out from, its window, and per
    window (by `window % WINDOWS`) what holds took from it less what it was lent."""

    spare: int
    limit: int
    window: int
    taken: tuple[int, ...]


@dataclass(frozen=True)
class CatchUp:
    """The write that brings a slot up to date before it is used: made (`before` None), or moved
    on to the current window (`zeroed` counters returned to `spare`) and the current limit (its
    share's difference), `delta` tokens in all."""

    slot: int
    before: Slot | None
    after: Slot
    zeroed: tuple[int, ...] = ()
    delta: int = 0


def caught_up(slot: Slot | None, index: int, limit: int, window: int) -> tuple[Slot, CatchUp | None]:
    """The slot as it is once up to date, and the write that makes it so (None: it is)."""
    if slot is None:
        made = Slot(share(index, limit), limit, window, (0,) * WINDOWS)
        return made, CatchUp(index, None, made)
    # a clock ahead of ours may have moved the slot on already: its window is the current one
    target = max(slot.window, window)
    zeroed = lapsing(slot.window, target)
    if not zeroed and slot.limit == limit:
        return slot, None
    delta = sum(slot.taken[i] for i in zeroed) + share(index, limit) - share(index, slot.limit)
    taken = tuple(0 if i in zeroed else count for i, count in enumerate(slot.taken))
    after = Slot(slot.spare + delta, limit, target, taken)
    return after, CatchUp(index, slot, after, zeroed, delta)


@dataclass(frozen=True)
class SlotWrite:
    """One slot's single write in a reservation: brought up to date (`catch_up`, None when it is)
    and `tokens` taken out of its spare ones (lent to the home slot, or, for the home slot, the
    hold less what it was lent), counted in `window`."""

    slot: int
    tokens: int
    window: int
    catch_up: CatchUp | None = None


@dataclass(frozen=True)
class Room:
    """How a hold fits: the lending slots' writes, then the home slot's (`writes`, home last),
    `take` tokens held in all; `missing` are the slots not made yet that it leaves alone."""

    take: int
    writes: tuple[SlotWrite, ...]
    missing: tuple[int, ...] = ()

    @property
    def home(self) -> SlotWrite:
        return self.writes[-1]


@dataclass(frozen=True)
class NoRoom:
    """The hold does not fit: `enqueued` tokens are held already."""

    enqueued: int


def plan(slots: Mapping[int, Slot | None], hold: Hold, tokens: int, limit: int, window: int) -> Room | NoRoom:
    """Where `hold` takes its `tokens` from under `limit` (above 0), given the slots as read.

    A part larger than the whole limit takes all of it, so it goes only when nothing else is held.
    """
    views: dict[int, Slot] = {}
    catch_ups: dict[int, CatchUp | None] = {}
    for index in range(QUEUE_SLOTS):
        views[index], catch_ups[index] = caught_up(slots.get(index), index, limit, window)
    # a slot below zero (its share shrank with the limit) owes tokens the others' spare ones pay
    room = sum(view.spare for view in views.values())
    need = min(tokens, limit)
    if room < need:
        return NoRoom(max(0, limit - room))
    home = hold.home
    writes: list[SlotWrite] = []
    short = need - views[home].spare
    # the fullest slots first, so a loan takes as few writes as it can
    for lender in sorted(hold.lenders(), key=lambda index: -views[index].spare):
        if short <= 0:
            break
        lent = min(max(0, views[lender].spare), short)
        if lent > 0:
            writes.append(SlotWrite(lender, lent, views[lender].window, catch_ups[lender]))
            short -= lent
    lent = sum(write.tokens for write in writes)
    writes.append(SlotWrite(home, need - lent, views[home].window, catch_ups[home]))
    touched = {write.slot for write in writes}
    # from the home slot on, so that shards of different homes do not all make the same one first
    around = [(home + n) % QUEUE_SLOTS for n in range(1, QUEUE_SLOTS)]
    missing = tuple(index for index in around if slots.get(index) is None and index not in touched)
    return Room(take=need, writes=tuple(writes), missing=missing)


def reconcile_due(checked: float, now: float) -> bool:
    """Whether the key's queue was last reconciled long enough ago to be reconciled again."""
    return now - checked >= RECONCILE_EVERY_S


@dataclass(frozen=True)
class Listed:
    """A Sluice batch as the provider lists it: whether it still holds its tokens, and when it
    ended (when it was created, for one that names no end)."""

    active: bool
    ended: float


def listed_batches(batches: Iterable[BatchStatus]) -> dict[tuple[str, int], dict[tuple[int, int], Listed]]:
    """The provider's Sluice batches by (job, shard), then by (part, attempt), from their tags."""
    found: dict[tuple[str, int], dict[tuple[int, int], Listed]] = {}
    for batch in batches:
        tag = batch.tag
        if tag is None:
            continue
        listed = Listed(batch.queued, batch.ended_at or batch.created_at)
        found.setdefault((tag.job, tag.shard), {})[(tag.part, tag.attempt)] = listed
    return found


def suspects(listed: Mapping[tuple[str, int], Mapping[tuple[int, int], Listed]], now: float) -> list[tuple[str, int]]:
    """The shards that may have died holding tokens: a batch of theirs ended over the grace ago,
    and a live shard would have collected it (and released its hold) by then."""
    return [
        shard
        for shard, batches in listed.items()
        if any(not b.active and b.ended + HOLD_GRACE_S <= now for b in batches.values())
    ]


def dead(since: float, batch: Listed | None, now: float) -> bool:
    """Whether a hold taken at `since` belongs to nobody: its batch ended over the grace ago, or
    it has none and is older than the grace."""
    if batch is None:
        return since + HOLD_GRACE_S <= now
    return not batch.active and batch.ended + HOLD_GRACE_S <= now
