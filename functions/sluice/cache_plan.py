"""Plan's half of the response cache: the job's keys, their hits, and the hits' answers written
into their shards, so that each shard sends only the rest.

Pass 1 (`sluice.line_pass.read_lines`) hands each request to `JobKeys`, which packs its key,
line tag and line (28 bytes) by the partition the key falls in. `find_hits` looks each
partition's keys up (`sluice.cache_lookup`) on a bounded pool of threads, freeing each as it
is done; a hit is packed too (34 bytes). Before the shards are cut, `CacheAnswers` fetches the
hits in windows of lines ahead of the cut: the window's input range (for its custom_ids) and one
ranged GET per segment it hits, each answer checked against its index row. So the cut counts
only answers Plan holds: a hit whose segment expired or vanished is a line to send, and a shard
never grows past `shard_lines` for an answer it cannot have. Each shard's answers are written
as the cut closes it (a finished part, or the outputs of a shard answered whole).
"""

from __future__ import annotations

import struct
import threading
from array import array
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import orjson

from .cache import answer_of, cache_key, cached_record, line_tag
from .cache_index import ANSWER_AT, KEY_BYTES, RECORDS_SUFFIX, UNKNOWN_MODEL, answer_usage, partition_of, partitions
from .cache_lookup import HIT, LOOKUP_THREADS, WANTED, CacheView
from .line_pass import KEYED, LineTable, ShardRange
from .lines import BOM
from .model import Request
from .parts import write_answered_shard, write_cached_part
from .records import record_id
from .stats import Stats

# a window of lines fetched at once: at most this many lines, input bytes or answer bytes
WINDOW_LINES = 5000
WINDOW_BYTES = 16 << 20
FETCH_THREADS = 8
# windows fetched ahead of the cut
PREFETCH = 8
WRITE_THREADS = 4
# answers being written at once, at most (a shard's are always let through)
WRITE_BYTES = 256 << 20
_RESPONSE = b',"response":'
_RECORD_END = b',"error":null}'


def shard_prefix(job_id: str, shard: int) -> str:
    return f"jobs/{job_id}/shards/{shard:05d}/"


class JobKeys:
    """Each request line's key, line tag and line, packed by the partition its key falls in."""

    def __init__(self, base_url: str, digits: int) -> None:
        self._base_url = base_url
        self._digits = digits
        self.buckets = [bytearray() for _ in range(partitions(digits))]

    def add(self, request: Request) -> None:
        key = cache_key(self._base_url, request.path, request.body, canonical=True)
        self.buckets[partition_of(key, self._digits)] += WANTED.pack(key, line_tag(request.custom_id), request.line)


@dataclass
class Hits:
    """The job's hits, packed (`HIT`), and for each line its hit's number plus one (0: none)."""

    rows: bytearray = field(default_factory=bytearray)
    at: array[int] = field(default_factory=lambda: array("I"))

    def __len__(self) -> int:
        return len(self.rows) // HIT.size

    def of(self, line: int) -> tuple[Any, ...] | None:
        number = self.at[line - 1]
        return None if not number else HIT.unpack_from(self.rows, (number - 1) * HIT.size)


def find_hits(view: CacheView, keys: JobKeys, lines: int) -> Hits:
    """Every line's hit in `view`, a partition per task; each partition's keys are freed once looked up."""
    hits = Hits(at=array("I", bytes(4 * lines)))

    def look(partition: int) -> bytes:
        wanted, keys.buckets[partition] = keys.buckets[partition], bytearray()
        return view.lookup(partition, wanted)

    with ThreadPoolExecutor(LOOKUP_THREADS) as pool:
        futures = [pool.submit(look, p) for p, wanted in enumerate(keys.buckets) if wanted]
        for future in as_completed(futures):
            found = future.result()
            first = len(hits)
            hits.rows += found
            for number, (line,) in enumerate(struct.iter_unpack("<I30x", found), first + 1):
                hits.at[line - 1] = number
    return hits


@dataclass(frozen=True)
class Window:
    first: int
    last: int
    start: int
    end: int


def windows(table: LineTable, hits: Hits) -> Iterator[Window]:
    """Runs of lines to fetch at once, each with hits, in input order."""
    lengths, at = table.lengths, hits.at
    offset = 0
    first = start = 0
    count = answer_bytes = 0
    for index in range(table.lines):
        number = at[index]
        if number and not count:
            first, start = index + 1, offset
        offset += lengths[index]
        if number:
            count += 1
            answer_bytes += struct.unpack_from("<I", hits.rows, (number - 1) * HIT.size + 12)[0]
        if count and (
            index + 2 - first >= WINDOW_LINES or offset - start >= WINDOW_BYTES or answer_bytes >= WINDOW_BYTES
        ):
            yield Window(first, index + 1, start, offset)
            count = answer_bytes = 0
    if count:
        yield Window(first, table.lines, start, offset)


@dataclass
class Answer:
    record: bytes
    model: str | None
    tokens_in: int
    tokens_out: int


class CacheAnswers:
    """Pass 2's answers: windows fetched ahead of the cut (`answer`), and each shard's written as
    the cut closes it (`closed`)."""

    def __init__(
        self,
        view: CacheView,
        hits: Hits,
        table: LineTable,
        *,
        s3: Any,
        bucket: str,
        key: str,
        etag: str,
        job_id: str,
    ) -> None:
        self._view, self._hits, self._table = view, hits, table
        self._s3, self._bucket, self._key, self._etag, self._job_id = s3, bucket, key, etag, job_id
        self._fetch = ThreadPoolExecutor(FETCH_THREADS)
        self._write = ThreadPoolExecutor(WRITE_THREADS)
        self._windows = windows(table, hits)
        self._ahead: deque[tuple[Window, Future[dict[int, Answer]]]] = deque()
        self._current: tuple[Window, dict[int, Answer]] | None = None
        self._rows: deque[tuple[int, Answer]] = deque()
        self._writes: list[Future[None]] = []
        self._room = threading.BoundedSemaphore(WRITE_BYTES >> 20)
        self.shard_hits: dict[int, int] = {}
        self.answered: set[int] = set()
        self._fill()

    def _fill(self) -> None:
        while len(self._ahead) < PREFETCH:
            window = next(self._windows, None)
            if window is None:
                return
            self._ahead.append((window, self._fetch.submit(self._fetch_window, window)))

    def answer(self, line: int) -> int | None:
        """The size of the answer Plan holds for `line`, fetched and checked; None if none."""
        while self._current is None or self._current[0].last < line:
            if not self._ahead:
                return None
            window, future = self._ahead[0]
            if window.first > line:
                return None
            self._ahead.popleft()
            self._current = (window, future.result())
            self._fill()
        found = self._current[1].get(line)
        if found is None:
            return None
        self._rows.append((line, found))
        return len(found.record)

    def closed(self, shard: ShardRange) -> None:
        end = shard.first_line + shard.lines
        rows: list[tuple[int, Answer]] = []
        while self._rows and self._rows[0][0] < end:
            rows.append(self._rows.popleft())
        if not rows:
            return
        self.shard_hits[shard.index] = len(rows)
        whole = shard.answered
        if whole:
            self.answered.add(shard.index)
        megabytes = min(WRITE_BYTES >> 20, max(1, shard.answer_bytes >> 20))
        for _ in range(megabytes):
            self._room.acquire()
        self._writes.append(self._write.submit(self._write_shard, shard.index, rows, whole, megabytes))

    def finish(self) -> None:
        """Wait for every shard's answers to be written; the first failure is raised."""
        try:
            for future in self._writes:
                future.result()
        finally:
            self._fetch.shutdown(cancel_futures=True)
            self._write.shutdown()

    def _write_shard(self, index: int, rows: list[tuple[int, Answer]], whole: bool, megabytes: int) -> None:
        try:
            stats = Stats()
            for _, found in rows:
                stats.add_cached(found.model, found.tokens_in, found.tokens_out)
            records = [(line, found.record) for line, found in rows]
            prefix = shard_prefix(self._job_id, index)
            if whole:
                write_answered_shard(self._s3, self._bucket, prefix, records, stats)
            else:
                write_cached_part(self._s3, self._bucket, prefix, records, stats)
        finally:
            for _ in range(megabytes):
                self._room.release()

    def _fetch_window(self, window: Window) -> dict[int, Answer]:
        """The window's answers that are where their index says, each as its result line."""
        view, hits, table = self._view, self._hits, self._table
        data = self._s3.get_object(
            Bucket=self._bucket, Key=self._key, IfMatch=self._etag, Range=f"bytes={window.start}-{window.end - 1}"
        )["Body"].read()
        custom_ids: dict[int, str] = {}
        by_segment: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
        at = 0
        for line in range(window.first, window.last + 1):
            length = table.lengths[line - 1]
            hit = hits.of(line) if table.kinds[line - 1] == KEYED else None
            if hit is not None:
                raw = data[at : at + length]
                custom_ids[line] = orjson.loads(raw[len(BOM) :] if line == 1 and raw.startswith(BOM) else raw)[
                    "custom_id"
                ]
                by_segment.setdefault(hit[1], []).append((line, hit))
            at += length
        found: dict[int, Answer] = {}
        for line, (answer, model, tokens_in, tokens_out) in fetch_answers(view, by_segment).items():
            record = cached_record(record_id(self._job_id, line), custom_ids[line], answer)
            found[line] = Answer(record, model, tokens_in, tokens_out)
        return found


def fetch_answers(
    view: CacheView, by_segment: dict[int, list[tuple[int, tuple[Any, ...]]]]
) -> dict[int, tuple[bytes, str | None, int, int]]:
    """(answer, model, tokens in, tokens out) by line, of each hit (`Hits.of`, by segment) whose
    row is where its index says: one ranged GET per segment, from its first row to its last."""
    found: dict[int, tuple[bytes, str | None, int, int]] = {}
    for slot, wanted in by_segment.items():
        segment = view.segment(slot)
        start = min(hit[2] for _, hit in wanted)
        end = max(hit[2] + hit[3] for _, hit in wanted)
        rows = view.read(segment, start, end) if segment else None
        if rows is None:
            continue
        records = segment.endswith(RECORDS_SUFFIX)
        for line, (_, _, offset, length, model, tokens_in, tokens_out, key) in wanted:
            answer = _answer_in(rows[offset - start : offset - start + length], length, key, records=records)
            if answer is None:
                continue
            name = view.model(model) if model != UNKNOWN_MODEL else None
            if name is None:
                name, tokens_in, tokens_out = answer_usage(orjson.loads(answer).get("body"))
            found[line] = (answer, name, tokens_in, tokens_out)
    return found


def _answer_in(row: bytes, length: int, key: bytes, *, records: bool) -> bytes | None:
    """The answer a segment's row holds, if the row is whole and is the one its index means: a
    result line (S3), or a local segment's row under the same key."""
    if len(row) != length or not row.endswith(b"\n"):
        return None
    if records:
        if row.startswith(b"{") and row.endswith(_RECORD_END + b"\n") and _RESPONSE in row:
            return answer_of(row[:-1])
        return None
    if len(row) <= ANSWER_AT or row[ANSWER_AT - 1] != 9 or row[KEY_BYTES * 2] != 9:
        return None
    return row[ANSWER_AT:-1] if row[: 2 * len(key)] == key.hex().encode() else None
