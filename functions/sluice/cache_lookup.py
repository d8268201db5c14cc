"""The cache as a reader sees it, and a job's keys looked up in it a partition at a time.

A reader lists `index/` once: the newest published generation (level 1) and the level-0
indexes it does not hold yet. It reads the generation's manifest and segment table, and the
level-0 indexes whole (compaction keeps them few), merged in memory into one sorted table.
The generation's partitions it reads only where the job's keys fall: around each key's
estimated row (keys are uniform, so a sorted partition's rank of a key is known to within a
few hundred rows), in one ranged GET per partition unless its keys are far apart, and the
whole partition once the ranges would cover half of it. So a lookup's memory is a partition
or so per thread, and its reads and bytes follow the job's keys, not the cache's size.

An answer whose segment was written more than `cache_ttl_days` ago (less a day's margin for
S3's lifecycle rule) is never a hit, in either level.
"""

from __future__ import annotations

import bisect
import math
import struct
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .cache_index import (
    KEY_PART,
    KEY_TAG,
    ROW,
    SEGMENT_SUFFIX,
    Level0,
    Manifest,
    SegmentTable,
    encode_index,
    expiry_cutoff,
    first_rows,
    generation_of,
    index_of_segment,
    is_level0,
    manifest_name,
    partition_name,
    partitions,
    segment_rows,
    segments_name,
)
from .cache_store import INDEXES, SEGMENTS, CacheStore, DirStore, Listed

LOOKUP_THREADS = 16
# level-0 rows a reader takes at most, newest first: compaction keeps far fewer; this bounds
# Plan if compaction falls behind (older answers are then misses until it catches up)
MAX_LEVEL0_ROWS = 2_000_000
# how far a key's row may stray from its estimate, in standard deviations of its rank, plus rows
WINDOW_SIGMAS = 6
WINDOW_EXTRA_ROWS = 16
# two ranges of a partition closer than this many rows are read as one
MERGE_GAP_ROWS = 2048
# a dict of a run's keys costs about this many binary searches in it (rows, sliced: 0.2 us a row;
# a search about 4 us)
BISECT_COST = 20
# job records a lookup takes at a time
LOOKUP_CHUNK = 65_536
# a job's record of a line's key: key (16 bytes), line tag, line
WANTED = struct.Struct("<16s8sI")
# a hit: line, segment, offset, length, model, tokens in, tokens out, and the key's first 8
# bytes (a local segment's row is checked against them)
HIT = struct.Struct("<IIIIHII8s")
_MASK64 = (1 << 64) - 1


@dataclass
class IndexListing:
    """One listing of `index/`: level-0 indexes, published generations, generation folders."""

    level0: list[Listed] = field(default_factory=list)
    manifests: dict[str, Listed] = field(default_factory=dict)
    folders: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, store: CacheStore) -> IndexListing:
        listing = cls()
        for entry in store.listing(INDEXES):
            generation = generation_of(entry.name)
            if is_level0(entry.name):
                listing.level0.append(entry)
            elif generation is not None and entry.name.endswith("/"):
                listing.folders.add(generation)
            elif generation is not None:
                listing.manifests[generation] = entry
        return listing

    @property
    def newest(self) -> str | None:
        return max(self.manifests) if self.manifests else None


def read_manifest(store: CacheStore, generation: str) -> Manifest | None:
    data = store.read(manifest_name(generation))
    return None if data is None else Manifest.decode(data)


def read_table(store: CacheStore, generation: str) -> SegmentTable:
    data = store.read(segments_name(generation))
    return SegmentTable() if data is None else SegmentTable.decode(data)


def index_killed_segments(store: DirStore, listing: IndexListing, known: Iterable[str]) -> None:
    """A local run killed mid-way left segments with no index: index them from their rows."""
    indexed = {entry.name for entry in listing.level0} | set(known)
    for entry in store.listing(SEGMENTS):
        segment = entry.name
        name = index_of_segment(segment)
        if not segment.endswith(SEGMENT_SUFFIX) or name in indexed or segment in indexed:
            continue
        store.write(name, encode_index(segment_rows(store.read(segment) or b"", segment)))
        listing.level0.append(Listed(name, 0, entry.modified))


def read_level0(
    store: CacheStore, indexes: list[Listed], table: SegmentTable, *, max_rows: int = MAX_LEVEL0_ROWS
) -> tuple[list[bytes], list[str]]:
    """The rows of level-0 `indexes` (newest first, up to `max_rows`), in the level-1 layout and
    sorted, their segments and models numbered after `table`'s (which they are appended to).
    Also the names of the indexes read."""
    chosen: list[Listed] = []
    rows_estimate = 0
    for entry in sorted(indexes, key=lambda e: e.modified, reverse=True):
        rows_estimate += entry.size // ROW.size
        if chosen and rows_estimate > max_rows:
            break
        chosen.append(entry)
    with ThreadPoolExecutor(LOOKUP_THREADS) as pool:
        datas = list(pool.map(lambda e: store.read(e.name), chosen))
    models = {name: number for number, name in enumerate(table.models)}
    rows: list[bytes] = []
    read: list[str] = []
    for entry, data in zip(chosen, datas, strict=True):
        parsed = Level0.parse(data) if data is not None else None
        if parsed is None:
            continue
        read.append(entry.name)
        counts = parsed.segment_rows()
        slots = [table.add(name, int(entry.modified), rows) for name, rows in zip(parsed.segments, counts, strict=True)]
        numbers = [models.setdefault(model, len(models)) for model in parsed.models]
        rows.extend(parsed.renumbered(slots, numbers))
    table.models[:] = list(models)
    rows.sort()
    return rows, read


@dataclass
class CacheView:
    """The cache as one reader (Plan) sees it: the newest generation and level 0 merged."""

    store: CacheStore
    cutoff: float = 0.0
    manifest: Manifest | None = None
    # the generation's segment slots, then level 0's segments
    table: SegmentTable = field(default_factory=SegmentTable)
    live: bytearray = field(default_factory=bytearray)
    # level 0's rows, sorted
    level0: list[bytes] = field(default_factory=list)
    reads: int = 0
    read_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, store: CacheStore, *, now: float, ttl_days: int) -> CacheView:
        view = cls(store, expiry_cutoff(now, ttl_days))
        listing = IndexListing.read(store)
        view.reads += 1
        newest = listing.newest
        consumed: set[str] = set()
        if newest is not None:
            view.manifest = read_manifest(store, newest)
            if view.manifest is not None:
                view.table = read_table(store, newest)
                consumed = set(view.manifest.consumed)
                view.reads += 2
        if isinstance(store, DirStore):
            index_killed_segments(store, listing, view.table.names)
        level0 = [e for e in listing.level0 if e.name not in consumed and e.modified >= view.cutoff]
        view.level0, read = read_level0(store, level0, view.table)
        view.reads += len(read)
        view.live = view.table.live(view.cutoff)
        return view

    @property
    def digits(self) -> int:
        return self.manifest.digits if self.manifest is not None else 0

    @property
    def partitions(self) -> int:
        return partitions(self.digits)

    def __len__(self) -> int:
        """Answers held (those expired but not yet compacted away included)."""
        return (self.manifest.answers if self.manifest is not None else 0) + len(self.level0)

    def segment(self, slot: int) -> str:
        return self.table.names[slot]

    def model(self, number: int) -> str | None:
        return None if number >= len(self.table.models) else self.table.models[number]

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
        """An object of the store, or a range of it (None: it is not there), counted."""
        data = self.store.read(name, start, end)
        with self._lock:
            self.reads += 1
            self.read_bytes += len(data or b"")
        return data

    def _read(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        return self.read(name, start, end) or b""

    def lookup(self, partition: int, wanted: bytes | bytearray) -> bytes:
        """Packed HIT rows for the job's `wanted` records (WANTED) of one partition: each line's
        own answer if the cache holds it, else any line's answer to the same request."""
        out = bytearray()
        whole: list[_Rows] = []
        step = LOOKUP_CHUNK * WANTED.size
        for at in range(0, len(wanted), step):
            out += self._lookup(partition, wanted[at : at + step], whole, len(wanted) // WANTED.size)
        return bytes(out)

    def _lookup(self, partition: int, wanted: bytes | bytearray, whole: list[_Rows], expected: int) -> bytes:
        keys = list(WANTED.iter_unpack(wanted))
        found: list[bytes | None] = [None] * len(keys)
        own = bytearray(len(keys))
        live, level0 = self.live, self.level0
        if level0:
            for i, (key, tag, _) in enumerate(keys):
                at = bisect.bisect_left(level0, key)
                while at < len(level0) and level0[at][:KEY_PART] == key:
                    row = level0[at]
                    if live[int.from_bytes(row[KEY_TAG : KEY_TAG + 4], "little")]:
                        if row[KEY_PART:KEY_TAG] == tag:
                            found[i], own[i] = row, 1
                            break
                        found[i] = found[i] or row
                    at += 1
        total = self.manifest.rows[partition] if self.manifest is not None else 0
        pending = [i for i in range(len(keys)) if not own[i]]
        if total and pending and self.manifest is not None:
            name = partition_name(self.manifest.generation, partition, self.digits)
            uncertain: list[int] = []
            for start, end, members in _ranges([keys[i][0] for i in pending], total, self.digits):
                chosen = [pending[m] for m in members]
                if start == 0 and end == total:
                    uncertain += chosen
                    continue
                rows = _Rows(self._read(name, start * ROW.size, end * ROW.size), len(chosen))
                uncertain += self._match(rows, start == 0, end == total, chosen, keys, found, own)
            if uncertain:
                if not whole:
                    whole.append(_Rows(self._read(name), expected))
                self._match(whole[0], True, True, uncertain, keys, found, own)
        # a hit is the row's segment, place and usage, in the same layout, between line and key
        return b"".join(
            line.to_bytes(4, "little") + hit[KEY_TAG:] + key[:8]
            for (key, _, line), hit in zip(keys, found, strict=True)
            if hit is not None
        )

    def _match(
        self,
        rows: _Rows,
        from_first: bool,
        to_last: bool,
        members: list[int],
        keys: list[tuple[bytes, bytes, int]],
        found: list[bytes | None],
        own: bytearray,
    ) -> list[int]:
        """Look `members` up in `rows`, a run of a partition's rows; those the run may not hold
        whole (a key before its first row or after its last, or rows of a key that reach its
        end) are returned."""
        data = rows.data
        if len(data) < ROW.size:
            return [] if from_first and to_last else members
        uncertain: list[int] = []
        low, high = data[:KEY_PART], data[-ROW.size : -ROW.size + KEY_PART]
        size, live = ROW.size, self.live
        for i in members:
            key, tag, _ = keys[i]
            at = rows.first(key)
            if at is None:
                if (key < low and not from_first) or (key > high and not to_last):
                    uncertain.append(i)
                continue
            chosen: bytes | None = None
            mine = 0
            at *= size
            while at < len(data) and data[at : at + KEY_PART] == key:
                row = data[at : at + size]
                if live[int.from_bytes(row[KEY_TAG : KEY_TAG + 4], "little")]:
                    if row[KEY_PART:KEY_TAG] == tag:
                        chosen, mine = row, 1
                        break
                    chosen = chosen or row
                at += size
            if at >= len(data) and not mine and not to_last:
                uncertain.append(i)
            elif chosen is not None and (mine or found[i] is None):
                found[i], own[i] = chosen, mine
        return uncertain


class _Rows:
    """A run of a partition's packed sorted rows, and the first row of a key in it: by a
    binary search for a few keys, by a dict of every row's key for many (a dict costs about as
    much to build as BISECT_COST binary searches)."""

    def __init__(self, data: bytes, lookups: int) -> None:
        self.data = data
        self._count = len(data) // ROW.size
        self._first = first_rows(data) if lookups * BISECT_COST > self._count else None

    def first(self, key: bytes) -> int | None:
        if self._first is not None:
            return self._first.get(key)
        data, size = self.data, ROW.size
        low, high = 0, self._count
        while low < high:
            middle = (low + high) // 2
            if data[middle * size : middle * size + KEY_PART] < key:
                low = middle + 1
            else:
                high = middle
        return low if low < self._count and data[low * size : low * size + KEY_PART] == key else None


def _ranges(keys: list[bytes], total: int, digits: int) -> list[tuple[int, int, list[int]]]:
    """Row ranges of a sorted partition of `total` rows to read for `keys`: (start, end, which
    keys); the whole partition once they would cover half of it."""
    if len(keys) * 4 * WINDOW_EXTRA_ROWS > total:
        return [(0, total, list(range(len(keys))))]
    spans: list[tuple[int, int, int]] = []
    shift = 4 * digits
    for i, key in enumerate(keys):
        fraction = ((int.from_bytes(key[:8], "big") << shift) & _MASK64) / 2.0**64
        estimate = fraction * total
        half = WINDOW_SIGMAS * math.sqrt(total * fraction * (1 - fraction)) + WINDOW_EXTRA_ROWS
        spans.append((max(0, int(estimate - half)), min(total, int(estimate + half) + 1), i))
    spans.sort()
    ranges: list[tuple[int, int, list[int]]] = []
    for start, end, i in spans:
        if ranges and start <= ranges[-1][1] + MERGE_GAP_ROWS:
            last = ranges[-1]
            ranges[-1] = (last[0], max(last[1], end), last[2])
            last[2].append(i)
        else:
            ranges.append((start, end, [i]))
    if sum(end - start for start, end, _ in ranges) * 2 > total:
        return [(0, total, list(range(len(keys))))]
    return ranges
