"""The cache as a reader sees it, and a job's keys looked up in it a partition at a time.

A reader lists `index/` once: the newest published generation (level 1) and the level-0
indexes it does not hold yet. It reads the generation's manifest and segment table, and the
level-0 indexes whole, their rows packed by partition (46 bytes each; compaction keeps them
few, but the answers of a job of 10 million lines are all there until it has folded them in).
The generation's partitions it reads only where the job's keys fall: around each key's
estimated row (keys are uniform, so a sorted partition's rank of a key is known to within a
few hundred rows), in one ranged GET per partition unless its keys are far apart, and the
whole partition once the ranges would cover half of it. So a lookup's memory is a partition
or so per thread, and its reads and bytes follow the job's keys, not the cache's size: up to
the whole generation for a job with more lines than about a hundredth of its answers.

An answer whose segment was written more than `cache_ttl_days` ago (less a day's margin for
S3's lifecycle rule) is never a hit, in either level.
"""

from __future__ import annotations

import itertools
import math
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sluice.cache.blobs import INDEXES, SEGMENTS, CacheStore, DirStore, Listed
from sluice.cache.index import (
    KEY_PART,
    KEY_TAG,
    ROW,
    SEGMENT_SUFFIX,
    Level0,
    Manifest,
    SegmentTable,
    digits_for,
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
from sluice.contract import causes
from sluice.providers import RequestFormat

LOOKUP_THREADS = 16
# level-0 rows a reader takes at most, newest first: compaction keeps far fewer, but a job of the
# documented maximum (10 million lines) adds as many before compaction has folded them in, and
# its re-run must find them all; this bounds Plan if compaction falls behind (older answers are
# then misses until it catches up)
MAX_LEVEL0_ROWS = 10_000_000
# a level-0 index's header: its magic, one segment's name and a model's, counts
INDEX_HEADER_BYTES = 128
# a segment number that names no segment: its rows are dropped
GONE = 0xFFFFFFFF
# how far a key's row may stray from its estimate, in standard deviations of its rank, plus rows:
# past 4 in 1 key of 16,000, which then reads its partition whole
WINDOW_SIGMAS = 4
WINDOW_EXTRA_ROWS = 16
# two ranges of a partition closer than this many rows are read as one: a GET's wait (30 ms, 16
# at once) is about what reading 190 KB more costs (at 100 MB/s)
MERGE_GAP_ROWS = 4096
# a dict of a run's keys costs about this many binary searches in it (rows, sliced: 0.2 us a row;
# a search about 4 us)
BISECT_COST = 20
# job records a lookup takes at a time
LOOKUP_CHUNK = 65_536
# a job's record of a line's key: key (16 bytes), line tag, line
WANTED = struct.Struct("<16s8sI")
# a hit: line, then its row's segment, offset, length, model, tokens in and out (26 bytes: it
# takes the place of the job's record of the line's key, 28)
HIT = struct.Struct("<IIIIHII")
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


def index_killed_segments(
    store: DirStore, listing: IndexListing, known: Iterable[str], request_format: RequestFormat
) -> None:
    """A local run killed mid-way left segments with no index: index them from their rows."""
    indexed = {entry.name for entry in listing.level0} | set(known)
    for entry in store.listing(SEGMENTS):
        segment = entry.name
        name = index_of_segment(segment)
        if not segment.endswith(SEGMENT_SUFFIX) or name in indexed or segment in indexed:
            continue
        encoded = encode_index(segment_rows(store.read(segment) or b"", segment, request_format))
        store.write(name, encoded)
        listing.level0.append(Listed(name, len(encoded), entry.modified))


def read_indexes(store: CacheStore, indexes: Iterable[Listed]) -> Iterator[tuple[Listed, Level0]]:
    """Each level-0 index parsed, read LOOKUP_THREADS at a time: only those in flight are held."""
    chosen = iter(indexes)
    with ThreadPoolExecutor(LOOKUP_THREADS) as pool:
        running = deque(pool.submit(_read_index, store, e) for e in itertools.islice(chosen, 2 * LOOKUP_THREADS))
        while running:
            found = running.popleft().result()
            for entry in itertools.islice(chosen, 1):
                running.append(pool.submit(_read_index, store, entry))
            if found is not None:
                yield found


@causes.caused(causes.CACHE_READ)
def _read_index(store: CacheStore, entry: Listed) -> tuple[Listed, Level0] | None:
    data = store.read(entry.name)
    parsed = Level0.parse(data) if data is not None else None
    return None if parsed is None else (entry, parsed)


Renumber = Callable[[Listed, Level0], tuple[list[int], list[int]]]


def bucket_rows(
    indexes: Iterable[tuple[Listed, Level0]], digits: int, renumber: Renumber, keep: bytearray | None = None
) -> list[bytes]:
    """Level-0 rows in the level-1 layout, numbered by `renumber` (a segment numbered _GONE, or
    whose slot `keep` says no, is dropped), by the partition their keys fall in at `digits`,
    each partition's sorted; of rows that share a key and line tag, the highest slot's (newest)."""
    buckets = [bytearray() for _ in range(partitions(digits))]
    shift = 32 - 4 * digits
    for entry, parsed in indexes:
        segments, models = renumber(entry, parsed)
        for row in parsed.renumbered(segments, models):
            slot = int.from_bytes(row[KEY_TAG : KEY_TAG + 4], "little")
            if slot != GONE and (keep is None or keep[slot]):
                buckets[int.from_bytes(row[:4], "big") >> shift if digits else 0] += row
    out: list[bytes] = []
    size = ROW.size
    for number, bucket in enumerate(buckets):
        data = bytes(bucket)
        buckets[number] = bytearray()
        unique: list[bytes] = []
        for row in sorted(data[at : at + size] for at in range(0, len(data), size)):
            if unique and unique[-1][:KEY_TAG] == row[:KEY_TAG]:
                if _slot(row) > _slot(unique[-1]):
                    unique[-1] = row
                continue
            unique.append(row)
        out.append(b"".join(unique))
    return out


def _slot(row: bytes) -> int:
    return int.from_bytes(row[KEY_TAG : KEY_TAG + 4], "little")


def index_rows(entry: Listed) -> int:
    """About how many rows a level-0 index holds, from its size (its header names one segment)."""
    return max(0, entry.size - INDEX_HEADER_BYTES) // ROW.size


def newest_first(indexes: list[Listed], max_rows: int) -> list[Listed]:
    """The newest of `indexes` up to about `max_rows` rows (at least one)."""
    chosen: list[Listed] = []
    rows = 0
    for entry in sorted(indexes, key=lambda e: e.modified, reverse=True):
        rows += index_rows(entry)
        if chosen and rows > max_rows:
            break
        chosen.append(entry)
    return chosen


@dataclass
class CacheView:
    """The cache as one reader (Plan) sees it: the newest generation and level 0, by partition.

    `digits` partitions the job's keys: the generation's, or more if level 0 is big, so that
    level 0's rows of a partition stay few; a partition of the job then falls in one of the
    generation's (`level1`), read only around its keys."""

    store: CacheStore
    cutoff: float = 0.0
    # how the answers' bodies read, where an index does not say their model and tokens
    request_format: RequestFormat = field(kw_only=True)
    manifest: Manifest | None = None
    # the generation's segment slots, then level 0's segments
    table: SegmentTable = field(default_factory=SegmentTable)
    live: bytearray = field(default_factory=bytearray)
    digits: int = 0
    # the level-0 indexes to read (`read_level0`), then their rows by partition, each sorted
    pending: list[Listed] = field(default_factory=list)
    level0: list[bytes] = field(default_factory=list)
    level0_rows: int = 0
    reads: int = 0
    read_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _partitions: dict[int, _Rows] = field(default_factory=dict)

    @classmethod
    def load(
        cls,
        store: CacheStore,
        *,
        now: float,
        ttl_days: int,
        request_format: RequestFormat,
        max_level0_rows: int = MAX_LEVEL0_ROWS,
    ) -> CacheView:
        """The newest generation's manifest and segment table, and which level-0 indexes to read."""
        view = cls(store, expiry_cutoff(now, ttl_days), request_format=request_format)
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
            index_killed_segments(store, listing, view.table.names, request_format)
        fresh = [e for e in listing.level0 if e.name not in consumed and e.modified >= view.cutoff]
        view.pending = newest_first(fresh, max_level0_rows)
        view.level0_rows = sum(map(index_rows, view.pending))
        view.digits = max(view.level1_digits, digits_for(view.level0_rows))
        view.live = view.table.live(view.cutoff)
        return view

    def read_level0(self) -> None:
        """Read the level-0 indexes: their rows by partition, their segments numbered after the
        generation's. Plan does this after its pass over the input, whose memory is then freed."""
        table = self.table
        models = {name: number for number, name in enumerate(table.models)}

        def renumber(entry: Listed, parsed: Level0) -> tuple[list[int], list[int]]:
            rows = parsed.segment_rows()
            slots = [table.add(name, int(entry.modified), n) for name, n in zip(parsed.segments, rows, strict=True)]
            return slots, [models.setdefault(model, len(models)) for model in parsed.models]

        self.level0 = bucket_rows(read_indexes(self.store, self.pending), self.digits, renumber)
        self.reads += len(self.pending)
        self.level0_rows = sum(len(rows) for rows in self.level0) // ROW.size
        table.models[:] = list(models)
        self.live = table.live(self.cutoff)

    @property
    def level1_digits(self) -> int:
        return self.manifest.digits if self.manifest is not None else 0

    @property
    def partitions(self) -> int:
        return partitions(self.digits)

    def __len__(self) -> int:
        """Answers held (those expired but not yet compacted away included)."""
        return (self.manifest.answers if self.manifest is not None else 0) + self.level0_rows

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
        own answer if the cache holds it, else any line's answer to the same request. The
        partition's level-0 rows are let go once looked up."""
        out = bytearray()
        expected = len(wanted) // WANTED.size
        level0 = _Rows(self.level0[partition], expected) if self.level0 else None
        whole: list[_Rows] = []
        step = LOOKUP_CHUNK * WANTED.size
        for at in range(0, len(wanted), step):
            out += self._lookup(partition, wanted[at : at + step], level0, whole, expected)
        if self.level0:
            self.level0[partition] = b""
        return bytes(out)

    def _lookup(
        self, partition: int, wanted: bytes | bytearray, level0: _Rows | None, whole: list[_Rows], expected: int
    ) -> bytes:
        keys = list(WANTED.iter_unpack(wanted))
        found: list[bytes | None] = [None] * len(keys)
        own = bytearray(len(keys))
        if level0 is not None:
            self._match(level0, True, True, range(len(keys)), keys, found, own)
        # the generation's partition this one falls in (the same one, unless level 0 is the bigger)
        manifest, shift = self.manifest, 4 * (self.digits - self.level1_digits)
        total = manifest.rows[partition >> shift] if manifest is not None else 0
        pending = [i for i in range(len(keys)) if not own[i]]
        if total and pending and manifest is not None and shift:
            # several of the job's partitions fall in this one: it is read whole, once for them all
            self._match(self._shared(partition >> shift, expected << shift), True, True, pending, keys, found, own)
        elif total and pending and manifest is not None:
            name = partition_name(manifest.generation, partition, manifest.digits)
            uncertain: list[int] = []
            for start, end, members in _ranges([keys[i][0] for i in pending], total, manifest.digits):
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
        # a hit is its line, then the row's segment, place and usage, in the same layout
        return b"".join(
            line.to_bytes(4, "little") + hit[KEY_TAG:] for (_, _, line), hit in zip(keys, found, strict=True) if hit
        )

    def _shared(self, partition: int, lookups: int) -> _Rows:
        """A generation's partition read whole, kept while the job's partitions in it are looked
        up (they are taken in order; a few are kept, for the threads that overlap)."""
        with self._lock:
            rows = self._partitions.get(partition)
            if rows is not None:
                return rows
        assert self.manifest is not None
        rows = _Rows(self._read(partition_name(self.manifest.generation, partition, self.manifest.digits)), lookups)
        with self._lock:
            self._partitions[partition] = rows
            while len(self._partitions) > 2 * LOOKUP_THREADS:
                del self._partitions[min(self._partitions)]
        return rows

    def _match(
        self,
        rows: _Rows,
        from_first: bool,
        to_last: bool,
        members: Iterable[int],
        keys: list[tuple[bytes, bytes, int]],
        found: list[bytes | None],
        own: bytearray,
    ) -> list[int]:
        """Look `members` up in `rows`, a run of a partition's rows; those the run may not hold
        whole (a key before its first row or after its last, or rows of a key that reach its
        end) are returned."""
        data = rows.data
        if len(data) < ROW.size:
            return [] if from_first and to_last else list(members)
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
