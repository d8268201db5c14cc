"""Plan's half of the response cache: the job's keys, their hits, and the hits' answers written
into their shards, so that each shard sends only the rest.

Pass 1 (`sluice.plan.line_pass.read_lines`) hands each request to `JobKeys`, which packs its key,
line tag and line (28 bytes) by the partition the key falls in. `find_hits` looks each
partition's keys up (`sluice.cache.lookup`) on a bounded pool of threads; its hits (26 bytes
each) take the place of its keys. Before the shards are cut, `CacheAnswers` fetches the hits
in windows of lines ahead of the cut: the window's input range (for its custom_ids) and one
ranged GET per segment it hits, each answer checked against its index row. So the cut counts
only answers Plan holds: a hit whose segment expired or vanished is a line to send, and a shard
never grows past `shard_lines` for an answer it cannot have. Each shard's answers are written
as the cut closes it (a finished part, or the outputs of a shard answered whole).
"""

from __future__ import annotations

import bisect
import hashlib
import struct
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.cache.entries import cache_key, line_tag
from sluice.cache.index import ANSWER_AT, KEY_BYTES, RECORDS_SUFFIX, UNKNOWN_MODEL, answer_usage, partitions
from sluice.cache.lookup import HIT, LOOKUP_THREADS, WANTED, CacheView
from sluice.contract import causes, shard_prefix
from sluice.contract.model import Request
from sluice.formats.lines import BOM, parse_line
from sluice.plan.line_pass import LineTable, ShardRange
from sluice.providers import OPENAI, RequestFormat
from sluice.shard.parts import write_cached_part, write_outputs
from sluice.shard.stats import Stats

# a window of lines fetched at once: at most this many lines, input bytes or answer bytes
WINDOW_LINES = 5000
WINDOW_BYTES = 16 << 20
FETCH_THREADS = 8
# windows fetched ahead of the cut
PREFETCH = 6
WRITE_THREADS = 1
# answers being written at once, at most (a shard's are always let through)
WRITE_BYTES = 64 << 20
_RESPONSE = b',"response":'
_RECORD_END = b',"error":null}'
# a line's first key, as most writers put it: its custom_id is then read without parsing the line
_ID_FIRST = (b'{"custom_id":"', b'{"custom_id": "')


class JobKeys:
    """Each request line's key, line tag and line, packed by the partition its key falls in.
    `model`, `default_model` and `request_format` are the job's, as Plan's pass reads the lines with them."""

    def __init__(
        self,
        base_url: str,
        digits: int,
        *,
        model: str | None = None,
        default_model: str | None = None,
        request_format: RequestFormat = OPENAI,
    ) -> None:
        self._base_url = base_url
        self._model, self._default_model = model, default_model
        self._format = request_format
        self._digits = digits
        self._shift = 32 - 4 * digits
        self.buckets = [bytearray() for _ in range(partitions(digits))]

    def add(self, request: Request) -> None:
        key = cache_key(self._base_url, request.path, request.body, canonical=True, provider=self._format.name)
        # `cache_index.partition_of`, inline: this runs for every line
        partition = int.from_bytes(key[:4], "big") >> self._shift if self._digits else 0
        self.buckets[partition] += WANTED.pack(key, line_tag(request.custom_id), request.line)

    def key_of(self, raw: bytes, line: int) -> bytes:
        """A request line's key again, from the line (Plan keeps only its first 16 bytes)."""
        request = parse_line(
            raw,
            line,
            model=self._model,
            default_model=self._default_model,
            sort_keys=True,
            request_format=self._format,
        )
        assert isinstance(request, Request)
        return cache_key(self._base_url, request.path, request.body, canonical=True, provider=self._format.name)


@dataclass
class Hits:
    """The job's hits, packed (`HIT`) as each partition's lookup returned them, and for each line
    its hit's number plus one (0: none). Kept as the lookups' own objects, not copied into one:
    each is about the size of the job's keys of its partition, freed just before."""

    at: array[int]
    chunks: list[bytearray] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    count: int = 0

    def __len__(self) -> int:
        return self.count

    def add(self, found: bytearray) -> None:
        first = self.count
        self.chunks.append(found)
        self.starts.append(first)
        for number, (line,) in enumerate(struct.iter_unpack(f"<I{HIT.size - 4}x", found), first + 1):
            self.at[line - 1] = number
        self.count += len(found) // HIT.size

    def _where(self, number: int) -> tuple[bytearray, int]:
        chunk = bisect.bisect_right(self.starts, number - 1) - 1
        return self.chunks[chunk], (number - 1 - self.starts[chunk]) * HIT.size

    def hit(self, number: int) -> tuple[Any, ...]:
        return HIT.unpack_from(*self._where(number))

    def length(self, number: int) -> int:
        chunk, at = self._where(number)
        return int.from_bytes(chunk[at + 12 : at + 16], "little")

    def of(self, line: int) -> tuple[Any, ...] | None:
        number = self.at[line - 1]
        return None if not number else self.hit(number)


def find_hits(view: CacheView, keys: JobKeys, lines: int) -> Hits:
    """Every line's hit in `view`, a partition per task; each partition's keys are freed once looked up."""
    hits = Hits(at=array("I", bytes(4 * lines)))

    def look(partition: int) -> bytearray:
        wanted, keys.buckets[partition] = keys.buckets[partition], bytearray()
        # the hits take the place of the keys (26 bytes each in 28): no memory more for them
        wanted[:] = view.lookup(partition, wanted)
        return wanted

    with ThreadPoolExecutor(LOOKUP_THREADS) as pool:
        futures = [pool.submit(look, p) for p, wanted in enumerate(keys.buckets) if wanted]
        for future in as_completed(futures):
            hits.add(future.result())
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
            answer_bytes += hits.length(number)
        if count and (
            index + 2 - first >= WINDOW_LINES or offset - start >= WINDOW_BYTES or answer_bytes >= WINDOW_BYTES
        ):
            yield Window(first, index + 1, start, offset)
            count = answer_bytes = 0
    if count:
        yield Window(first, table.lines, start, offset)


# a hit's result line (with its newline), model, tokens in and out
Answer = tuple[bytes, str | None, int, int]


class CacheAnswers:
    """Pass 2's answers: windows fetched ahead of the cut (`answer`), and each shard's written as
    the cut closes it (`closed`)."""

    def __init__(
        self,
        view: CacheView,
        hits: Hits,
        table: LineTable,
        keys: JobKeys,
        *,
        s3: Any,
        bucket: str,
        key: str,
        pin: Mapping[str, str],
        job_id: str,
        keep: Callable[[bytes, bytes], bool] | None = None,
    ) -> None:
        self._view, self._hits, self._table, self._keys = view, hits, table, keys
        # whether a cached answer may be given (a validating job's checks): from the request line
        # and the answer; one that may not is a line to send
        self._keep_answer = keep
        self._s3, self._bucket, self._key, self._pin, self._job_id = s3, bucket, key, dict(pin), job_id
        self._fetch = ThreadPoolExecutor(FETCH_THREADS)
        self._write = ThreadPoolExecutor(WRITE_THREADS)
        self._windows = windows(table, hits)
        self._ahead: deque[tuple[Window, Future[dict[int, Answer]]]] = deque()
        self._current: tuple[Window, dict[int, Answer]] | None = None
        # the answers of the shard being cut: result lines, their lines, their figures; and the
        # last answer given, which may be the next shard's (the cut has not placed it yet)
        self._records: list[bytes] = []
        self._lines: array[int] = array("I")
        self._stats = Stats()
        self._last: tuple[int, Answer] | None = None
        self._writes: list[Future[None]] = []
        self._room = threading.BoundedSemaphore(WRITE_BYTES >> 20)
        self._record_ids = record_ids(job_id)
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
        if self._last is not None:
            self._keep(*self._last)
        self._last = (line, found)
        return len(found[0])

    def _keep(self, line: int, found: Answer) -> None:
        self._records.append(found[0])
        self._lines.append(line)
        self._stats.add_cached(*found[1:])

    def closed(self, shard: ShardRange) -> None:
        if self._last is not None and self._last[0] < shard.first_line + shard.lines:
            self._keep(*self._last)
            self._last = None
        if not self._records:
            return
        records, lines, stats = self._records, self._lines, self._stats
        self._records, self._lines, self._stats = [], array("I"), Stats()
        self.shard_hits[shard.index] = len(records)
        whole = shard.answered
        if whole:
            self.answered.add(shard.index)
        megabytes = min(WRITE_BYTES >> 20, max(1, shard.answer_bytes >> 20))
        for _ in range(megabytes):
            self._room.acquire()
        task = self._write.submit(self._write_shard, shard.index, records, lines, stats, whole, megabytes)
        self._writes.append(task)

    def finish(self) -> None:
        """Wait for every shard's answers to be written; the first failure is raised."""
        try:
            for future in self._writes:
                future.result()
        finally:
            self._fetch.shutdown(cancel_futures=True)
            self._write.shutdown()

    def _write_shard(
        self, index: int, records: list[bytes], lines: array[int], stats: Stats, whole: bool, megabytes: int
    ) -> None:
        try:
            prefix = shard_prefix(self._job_id, index)
            if whole:
                # the shard's outputs, as `parts.write_answered_shard` writes them from the same lines
                write_outputs(self._s3, self._bucket, prefix, records, [], stats)
            else:
                rows = [(line, record[:-1]) for line, record in zip(lines, records, strict=True)]
                write_cached_part(self._s3, self._bucket, prefix, rows, stats)
        finally:
            for _ in range(megabytes):
                self._room.release()

    @causes.under(causes.PLAN)
    def _fetch_window(self, window: Window) -> dict[int, Answer]:
        """The window's answers that are where their index says, each as its result line."""
        hits = self._hits
        data = self._s3.get_object(
            Bucket=self._bucket, Key=self._key, Range=f"bytes={window.start}-{window.end - 1}", **self._pin
        )["Body"].read()
        custom_ids: dict[int, bytes] = {}
        spans: dict[int, tuple[int, int]] = {}
        by_segment: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
        at, line = 0, window.first
        lengths = self._table.lengths[window.first - 1 : window.last]
        for length, number in zip(lengths, hits.at[window.first - 1 : window.last], strict=True):
            if number:
                hit = hits.hit(number)
                raw = data[at : at + length]
                custom_ids[line] = custom_id_json(raw[len(BOM) :] if line == 1 and raw.startswith(BOM) else raw)
                spans[line] = (at, length)
                by_segment.setdefault(hit[1], []).append((line, hit))
            at += length
            line += 1

        def key_of(line: int) -> bytes:
            start, length = spans[line]
            return self._keys.key_of(data[start : start + length], line)

        found: dict[int, Answer] = {}
        ids = self._record_ids
        keep = self._keep_answer
        for line, (answer, model, tokens_in, tokens_out) in fetch_answers(self._view, by_segment, key_of).items():
            if keep is not None:
                start, length = spans[line]
                if not keep(data[start : start + length], answer):
                    continue
            found[line] = (cached_line(ids(line), custom_ids[line], answer), model, tokens_in, tokens_out)
        return found


def custom_id_json(raw: bytes) -> bytes:
    """A valid request line's custom_id as orjson writes it: taken from the line when it is the
    first key, alone, and has no escape (then it is the same bytes), else parsed."""
    for prefix in _ID_FIRST:
        if raw.startswith(prefix):
            end = raw.find(b'"', len(prefix))
            token = raw[len(prefix) - 1 : end + 1]
            if end > 0 and b"\\" not in token and raw.count(b'"custom_id"') == 1:
                return token
            break
    return orjson.dumps(orjson.loads(raw)["custom_id"])


def record_ids(job_id: str) -> Callable[[int], bytes]:
    """`records.record_id` as JSON, for each line of one job: the job's part of the hash once."""
    job = hashlib.blake2b(f"{job_id}:".encode(), digest_size=12)

    def record_id(line: int) -> bytes:
        hashed = job.copy()
        hashed.update(b"%d" % line)
        return b'"batch_req_' + hashed.hexdigest().encode() + b'"'

    return record_id


def cached_line(record_id: bytes, custom_id: bytes, answer: bytes) -> bytes:
    """`cache.cached_record` from JSON already encoded, with its newline: a result line."""
    return b'{"id":%s,"custom_id":%s,"response":%s,"error":null,"cached":true}\n' % (record_id, custom_id, answer)


def fetch_answers(
    view: CacheView, by_segment: dict[int, list[tuple[int, tuple[Any, ...]]]], key_of: Callable[[int], bytes]
) -> dict[int, tuple[bytes, str | None, int, int]]:
    """(answer, model, tokens in, tokens out) by line, of each hit (`Hits.of`, by segment) whose
    row is where its index says: one ranged GET per segment, from its first row to its last.
    `key_of(line)`: the line's key, which a local segment's row must have."""
    found: dict[int, tuple[bytes, str | None, int, int]] = {}
    for slot, wanted in by_segment.items():
        segment = view.segment(slot)
        start = min(hit[2] for _, hit in wanted)
        end = max(hit[2] + hit[3] for _, hit in wanted)
        rows = view.read(segment, start, end) if segment else None
        if rows is None:
            continue
        records = segment.endswith(RECORDS_SUFFIX)
        for line, (_, _, offset, length, model, tokens_in, tokens_out) in wanted:
            row = rows[offset - start : offset - start + length]
            answer = _answer_in(row, length, None if records else key_of(line))
            if answer is None:
                continue
            name = view.model(model) if model != UNKNOWN_MODEL else None
            if name is None:
                name, tokens_in, tokens_out = answer_usage(orjson.loads(answer).get("body"), view.request_format)
            found[line] = (answer, name, tokens_in, tokens_out)
    return found


def _answer_in(row: bytes, length: int, key: bytes | None) -> bytes | None:
    """The answer a segment's row holds, if the row is whole and is the one its index means: a
    result line (S3; `key` None), or a local segment's row under `key`."""
    if len(row) != length or not row.endswith(b"\n"):
        return None
    if key is None:
        at = row.find(_RESPONSE) if row.startswith(b"{") and row.endswith(_RECORD_END + b"\n") else -1
        return None if at < 0 else row[at + len(_RESPONSE) : -len(_RECORD_END) - 1]
    if len(row) <= ANSWER_AT or row[ANSWER_AT - 1] != 9 or row[KEY_BYTES * 2] != 9:
        return None
    return row[ANSWER_AT:-1] if row[: 2 * len(key)] == key.hex().encode() else None
