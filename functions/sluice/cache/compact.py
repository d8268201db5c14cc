"""Compaction: level 0 folded into a new level-1 generation, and what expired dropped.

A generation is planned once (`plan.json` and its segment table, written first), then built a
partition at a time, in as many calls as it takes: Merge gives each job's end a slice of time
(`compact`), so the work is never on Plan's path, is bounded per call, and resumes in the next
job. A partition is a pure function of the plan (its base generation's partition, the
level-0 rows the plan names, the plan's expiry cutoff), so two calls that build the same one
write the same bytes. The manifest, written last once every partition is there, publishes the
generation; readers use the newest published one. Names are unique (time and a random token),
and nothing a reader may still use is deleted before a grace period: superseded generations,
and the level-0 indexes a published generation holds.

What expired goes at each generation: rows whose segment the bucket no longer lists, or wrote
more than `cache_ttl_days` ago (less a day's margin); their slots stay, nameless. So the index
shrinks as segments expire, and an index never names a segment that is gone for long.
"""

from __future__ import annotations

import secrets
import struct
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import orjson

from sluice.cache.blobs import INDEXES, SEGMENTS, CacheStore, Listed
from sluice.cache.index import (
    KEY_TAG,
    ROW,
    Level0,
    Manifest,
    SegmentTable,
    digits_for,
    expiry_cutoff,
    generation_folder,
    manifest_name,
    partition_name,
    partition_start,
    partitions,
    plan_name,
    segments_name,
)
from sluice.cache.lookup import (
    GONE,
    CacheView,
    IndexListing,
    bucket_rows,
    index_rows,
    read_indexes,
    read_manifest,
    read_table,
)
from sluice.contract import causes
from sluice.providers import RequestFormat

# level-0 indexes, or rows, that start a new generation: what a reader takes in whole each time
COMPACT_AT = 64
COMPACT_ROWS = 500_000
# level-0 rows one generation takes in at most (oldest first): bounds a call's memory (46 bytes a
# row, by partition), while a job of the documented maximum is folded in three generations
MAX_CONSUMED_ROWS = 4_000_000
# with a TTL, a generation this old is redone even with nothing new, to drop what expired
SWEEP_AFTER_S = 86_400
# what a reader may still be using outlives its replacement by this long (Plan's timeout)
GRACE_S = 900
# a generation still unpublished after this long is given up
ABANDON_AFTER_S = 86_400
COMPACT_THREADS = 8
# the time a job's Merge gives compaction after the job is merged, and what it leaves the Lambda
SLICE_S = 60.0
SLICE_MARGIN_S = 30.0
_DEAD = 0xFFFFFFFF
_SLOT = struct.Struct(f"<{KEY_TAG}xI{ROW.size - KEY_TAG - 4}x")


@dataclass
class Compacted:
    """What one call did."""

    generation: str | None = None
    partitions: int = 0
    published: bool = False
    deleted: int = 0


@dataclass(frozen=True)
class GenerationPlan:
    generation: str
    base: str | None
    digits: int
    # the level-0 indexes it folds in, and those its base held that are not deleted yet
    consumed: list[str]
    carried: list[str]
    cutoff: float
    started: float

    def encode(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def decode(cls, data: bytes) -> GenerationPlan:
        return cls(**orjson.loads(data))


def compact(
    store: CacheStore,
    *,
    now: float,
    ttl_days: int,
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> Compacted:
    """Do what compaction there is to do until `deadline` (on `clock`), and leave the rest."""
    done = Compacted()
    listing = IndexListing.read(store)
    newest = listing.newest
    manifest = read_manifest(store, newest) if newest is not None else None
    done.deleted = _collect(store, listing, manifest, now)
    plan = _pending(store, listing, newest, now)
    if plan is None:
        plan = _start(store, listing, manifest, now=now, ttl_days=ttl_days)
    if plan is None:
        return done
    done.generation = plan.generation
    done.partitions, done.published = _build(store, plan, manifest, deadline=deadline, clock=clock, now=now)
    return done


@causes.caused(causes.COMPACT)
def compact_slice(store: CacheStore, *, ttl_days: int, remaining_s: float) -> Compacted:
    """One call's share of compaction: SLICE_S, or what the Lambda has left less a margin."""
    slice_s = min(SLICE_S, remaining_s - SLICE_MARGIN_S)
    if slice_s <= 0:
        return Compacted()
    return compact(store, now=time.time(), ttl_days=ttl_days, deadline=time.monotonic() + slice_s)


def _collect(store: CacheStore, listing: IndexListing, manifest: Manifest | None, now: float) -> int:
    """Delete what no reader uses any more: generations and level-0 indexes the newest
    generation replaced more than GRACE_S ago."""
    if manifest is None or manifest.published > now - GRACE_S:
        return 0
    gone = [name for name in manifest.consumed if name in {e.name for e in listing.level0}]
    for generation in listing.manifests:
        if generation != manifest.generation:
            gone += [e.name for e in store.listing(generation_folder(generation), recursive=True)]
            gone.append(manifest_name(generation))
    for generation in listing.folders - set(listing.manifests):
        data = store.read(plan_name(generation))
        plan = GenerationPlan.decode(data) if data is not None else None
        if plan is None or plan.base != manifest.generation or plan.started < now - ABANDON_AFTER_S:
            gone += [e.name for e in store.listing(generation_folder(generation), recursive=True)]
    store.delete(gone)
    return len(gone)


def _pending(store: CacheStore, listing: IndexListing, newest: str | None, now: float) -> GenerationPlan | None:
    """The unpublished generation to go on building: planned on the newest, and not given up."""
    for generation in sorted(listing.folders - set(listing.manifests)):
        data = store.read(plan_name(generation))
        if data is None:
            continue
        plan = GenerationPlan.decode(data)
        if plan.base == newest and plan.started >= now - ABANDON_AFTER_S:
            return plan
    return None


def _start(
    store: CacheStore, listing: IndexListing, manifest: Manifest | None, *, now: float, ttl_days: int
) -> GenerationPlan | None:
    """Plan a new generation if level 0 has grown, or the newest is old enough to sweep."""
    cutoff = expiry_cutoff(now, ttl_days)
    consumed = set(manifest.consumed) if manifest is not None else set()
    fresh = [e for e in listing.level0 if e.name not in consumed and e.modified >= cutoff]
    rows = sum(map(index_rows, fresh))
    stale = manifest is not None and ttl_days > 0 and manifest.published <= now - SWEEP_AFTER_S
    if len(fresh) < COMPACT_AT and rows < COMPACT_ROWS and not stale:
        return None
    taken: list[Listed] = []
    taken_rows = 0
    for entry in sorted(fresh, key=lambda e: e.modified):
        taken_rows += index_rows(entry)
        if taken and taken_rows > MAX_CONSUMED_ROWS:
            break
        taken.append(entry)
    table = read_table(store, manifest.generation) if manifest is not None else SegmentTable()
    present = {e.name: e.modified for e in store.listing(SEGMENTS)}
    for slot, name in enumerate(table.names):
        if name and (name not in present or table.times[slot] < cutoff):
            table.drop(slot)
    slots = {name: slot for slot, name in enumerate(table.names) if name}
    models = {name: number for number, name in enumerate(table.models)}
    for _, parsed in read_indexes(store, taken):
        for segment, rows in zip(parsed.segments, parsed.segment_rows(), strict=True):
            if segment in slots:
                table.rows[slots[segment]] += rows
            elif segment in present and present[segment] >= cutoff:
                slots[segment] = table.add(segment, int(present[segment]), rows)
        for model in parsed.models:
            models.setdefault(model, len(models))
    table.models[:] = list(models)
    generation = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
    present_level0 = {e.name for e in listing.level0}
    plan = GenerationPlan(
        generation=generation,
        base=manifest.generation if manifest is not None else None,
        # rows a line asked twice count twice: a generation may be a little finer than needed
        digits=digits_for(sum(table.rows)),
        consumed=[e.name for e in taken],
        carried=[name for name in sorted(consumed) if name in present_level0],
        cutoff=cutoff,
        started=now,
    )
    store.write(segments_name(generation), table.encode())
    # the plan last: a folder with a plan has its segment table
    store.write(plan_name(generation), plan.encode())
    return plan


def _build(
    store: CacheStore,
    plan: GenerationPlan,
    base: Manifest | None,
    *,
    deadline: float,
    clock: Callable[[], float],
    now: float,
) -> tuple[int, bool]:
    """Write the plan's partitions not written yet, until `deadline`; publish once all are there."""
    if base is not None and base.generation != plan.base:
        base = read_manifest(store, plan.base) if plan.base is not None else None
    data = store.read(segments_name(plan.generation))
    if data is None:
        # collected as given up while this call was planning it
        return 0, False
    table = SegmentTable.decode(data)
    keep = table.live(plan.cutoff)
    level0 = _level0_rows(store, plan, table, keep)
    written = {e.name for e in store.listing(generation_folder(plan.generation))}
    digits = plan.digits
    base_digits = base.digits if base is not None else digits
    units: list[list[int]]
    if digits >= base_digits:
        fan = partitions(digits - base_digits)
        units = [list(range(q * fan, (q + 1) * fan)) for q in range(partitions(base_digits))]
    else:
        units = [[p] for p in range(partitions(digits))]
    units = [[p for p in unit if partition_name(plan.generation, p, digits) not in written] for unit in units]
    units = [unit for unit in units if unit]
    count = 0
    with ThreadPoolExecutor(COMPACT_THREADS) as pool:
        running: list[Future[int]] = []
        for unit in units:
            if clock() >= deadline:
                break
            running.append(pool.submit(_write_unit, store, plan, base, unit, level0, keep))
            while len(running) >= COMPACT_THREADS:
                count += running.pop(0).result()
        count += sum(future.result() for future in running)
    listing = {e.name: e.size for e in store.listing(generation_folder(plan.generation))}
    names = [partition_name(plan.generation, p, digits) for p in range(partitions(digits))]
    if any(name not in listing for name in names):
        return count, False
    # publish only on the generation the plan was made from: another may have won meanwhile
    if IndexListing.read(store).newest != plan.base:
        return count, False
    manifest = Manifest(
        generation=plan.generation,
        digits=digits,
        rows=[listing[name] // ROW.size for name in names],
        consumed=sorted({*plan.consumed, *plan.carried}),
        published=now,
        base=plan.base,
    )
    store.write(manifest_name(plan.generation), manifest.encode())
    return count, True


def _level0_rows(store: CacheStore, plan: GenerationPlan, table: SegmentTable, keep: bytearray) -> list[bytes]:
    """The plan's level-0 rows in the generation's numbering, by partition, each sorted, one a
    key and line tag (the newest); rows whose segment is gone or expired are dropped."""
    slots = {name: slot for slot, name in enumerate(table.names) if name}
    models = {name: number for number, name in enumerate(table.models)}

    def renumber(_: Listed, parsed: Level0) -> tuple[list[int], list[int]]:
        return [slots.get(s, GONE) for s in parsed.segments], [models[m] for m in parsed.models]

    return bucket_rows(read_indexes(store, [Listed(n) for n in plan.consumed]), plan.digits, renumber, keep)


def _bisect(rows: bytes, prefix: bytes, low: int = 0) -> int:
    """The first row of packed sorted `rows`, from row `low` on, not below `prefix`."""
    high = len(rows) // ROW.size
    size, width = ROW.size, len(prefix)
    while low < high:
        middle = (low + high) // 2
        if rows[middle * size : middle * size + width] < prefix:
            low = middle + 1
        else:
            high = middle
    return low


def _write_unit(
    store: CacheStore,
    plan: GenerationPlan,
    base: Manifest | None,
    unit: list[int],
    level0: list[bytes],
    keep: bytearray,
) -> int:
    """Build and write the partitions of `unit` (those one base partition splits into, or one
    partition that several base partitions fold into)."""
    digits = plan.digits
    base_rows = b""
    if base is not None:
        if base.digits <= digits:
            q = unit[0] >> (4 * (digits - base.digits))
            if base.rows[q]:
                base_rows = store.read(partition_name(base.generation, q, base.digits)) or b""
        else:
            fan = partitions(base.digits - digits)
            base_rows = b"".join(
                store.read(partition_name(base.generation, q, base.digits)) or b""
                for q in range(unit[0] * fan, (unit[0] + 1) * fan)
                if base.rows[q]
            )
    base_rows = _kept(base_rows, keep)
    for p in unit:
        low = partition_start(p, digits)
        # the next partition's lowest key, or none past the last
        high = partition_start(p + 1, digits) if p + 1 < partitions(digits) else None
        start = _bisect(base_rows, low)
        end = len(base_rows) // ROW.size if high is None else _bisect(base_rows, high, start)
        own = base_rows[start * ROW.size : end * ROW.size]
        store.write(partition_name(plan.generation, p, digits), _merged(own, level0[p]))
    return len(unit)


def _kept(rows: bytes, keep: bytearray) -> bytes:
    """`rows` without those whose segment is gone or expired."""
    slots = [slot for (slot,) in _SLOT.iter_unpack(rows)]
    if all(keep[slot] for slot in slots):
        return rows
    size = ROW.size
    return b"".join(rows[i * size : (i + 1) * size] for i, slot in enumerate(slots) if keep[slot])


def _merged(rows: bytes, new: bytes) -> bytes:
    """Sorted `rows` with the sorted `new` rows in their places; a new row replaces a row with
    the same key and line tag (it is the newer answer)."""
    if not new:
        return rows
    pieces: list[bytes] = []
    size = ROW.size
    at = 0
    for row in (new[i : i + size] for i in range(0, len(new), size)):
        place = _bisect(rows, row[:KEY_TAG], at)
        pieces.append(rows[at * size : place * size])
        pieces.append(row)
        at = place + 1 if rows[place * size : place * size + KEY_TAG] == row[:KEY_TAG] else place
    pieces.append(rows[at * size :])
    return b"".join(pieces)


def stats(store: CacheStore, request_format: RequestFormat) -> dict[str, int]:
    """Answers held and the distinct requests they answer, and the objects and bytes they take
    (`request_format`: how the answers of a segment with no index yet read)."""
    view = CacheView.load(store, now=time.time(), ttl_days=0, request_format=request_format)
    view.read_level0()
    keys = {rows[at : at + 16] for rows in view.level0 for at in range(0, len(rows), ROW.size)}
    if view.manifest is not None:
        for p, rows in enumerate(view.manifest.rows):
            if rows:
                data = store.read(partition_name(view.manifest.generation, p, view.manifest.digits)) or b""
                keys.update(data[at : at + 16] for at in range(0, len(data), ROW.size))
    objects = [e for folder in (INDEXES, SEGMENTS) for e in store.listing(folder, recursive=True)]
    return {
        "answers": len(view),
        "requests": len(keys),
        "objects": len(objects),
        "bytes": sum(e.size for e in objects),
    }


def clear(store: CacheStore) -> int:
    names = [e.name for folder in (INDEXES, SEGMENTS) for e in store.listing(folder, recursive=True)]
    store.delete(names)
    return len(names)
