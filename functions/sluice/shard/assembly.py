"""A finished shard's outputs: its parts assembled into `results.jsonl` and `errors.jsonl` in input
order, and its stats beside them (`assemble`, `assemble_outputs`), or written whole from rows in
hand (`write_outputs`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from contextlib import suppress
from functools import partial
from typing import Any, TypeVar

import orjson
from botocore.exceptions import ClientError

from sluice.contract import ShardStats, causes
from sluice.core.records import error_record
from sluice.shard.frame import ShardSpec, read_shard_lines
from sluice.shard.parts import PART_MAX_AGE_S, PART_ROWS_MAX, S3_IN_FLIGHT, part_body, part_objects, s3_pool, stats_key
from sluice.shard.stats import Stats

# What an assembly holds of a shard's outputs at once. A shard's answers may be far larger than its
# lines (a batch shard holds up to 50,000 of them: at 4 kB an answer, 200 MB, and 50,000 embeddings
# are 1.5 GB), and a step has 1 GB: up to this much of parts it keeps them as read and writes from
# them; past it, it keeps where each row is, and writes the rows in windows of this many bytes, each
# read again from its parts by ranges
ASSEMBLY_WINDOW_BYTES = 64 << 20
# what an assembly's reads in flight hold at most, beside the window
IN_FLIGHT_BYTES = ASSEMBLY_WINDOW_BYTES // 2
# an output file larger than this goes up as a multipart upload of pieces this size (S3 takes pieces
# of at least 5 MiB), so that no step holds a file whole
UPLOAD_PIECE_BYTES = 8 << 20

_T = TypeVar("_T")

# where a row's record is: its part (by number, in the order the parts were written), its first
# and past-last byte there, and whether it is a result
_Where = tuple[int, int, int, bool]


def _spans(data: bytes) -> Iterator[tuple[int, bytes, int, int]]:
    """(line, kind, start, end) of each row of a part: its record is `data[start:end]`."""
    position, size = 0, len(data)
    while position < size:
        end = data.find(b"\n", position)
        end = size if end < 0 else end
        tab = data.index(b"\t", position, end)
        yield int(data[position:tab]), data[tab + 1 : tab + 2], tab + 3, end
        position = end + 1


def _ahead(fetch: Executor, reads: Iterable[tuple[int, Callable[[], _T]]], budget: int) -> Iterator[_T]:
    """Each read's answer in order, the next ones fetched meanwhile while those in flight hold at
    most `budget` bytes (the sizes given with them) and S3_IN_FLIGHT requests; one always goes."""
    ahead: deque[tuple[int, Future[_T]]] = deque()
    held = 0
    following = iter(reads)
    waiting = next(following, None)
    while True:
        while waiting is not None and (not ahead or (held + waiting[0] <= budget and len(ahead) < S3_IN_FLIGHT)):
            ahead.append((waiting[0], fetch.submit(waiting[1])))
            held += waiting[0]
            waiting = next(following, None)
        if not ahead:
            return
        size, answer = ahead.popleft()
        held -= size
        yield answer.result()


def _range(s3: Any, bucket: str, key: str, start: int, end: int) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"].read())


class _Upload:
    """An object written as it is made: one PUT when it ends under UPLOAD_PIECE_BYTES, else a
    multipart upload of pieces of that size."""

    def __init__(self, s3: Any, bucket: str, key: str) -> None:
        self._s3, self._bucket, self._key = s3, bucket, key
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._pieces: list[dict[str, Any]] = []
        self.lines = 0
        self.size = 0

    def write(self, record: bytes | memoryview) -> None:
        self._buffer += record
        self._buffer += b"\n"
        self.lines += 1
        self.size += len(record) + 1
        if len(self._buffer) >= UPLOAD_PIECE_BYTES:
            self._send()

    @causes.under(causes.SHARD_END, causes.SHARD_FAILED, causes.MARK_FAILED)
    def _send(self) -> None:
        if self._upload_id is None:
            self._upload_id = self._s3.create_multipart_upload(Bucket=self._bucket, Key=self._key)["UploadId"]
        number = len(self._pieces) + 1
        # bytes, not the bytearray: botocore passes a body it need not checksum on as it is, and
        # an HTTP stack may take a bytearray for form fields (moto's does: AttributeError 'items')
        piece, self._buffer = bytes(self._buffer), bytearray()
        answer = self._s3.upload_part(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, PartNumber=number, Body=piece
        )
        self._pieces.append({"ETag": answer["ETag"], "PartNumber": number})

    @causes.under(causes.SHARD_END, causes.SHARD_FAILED, causes.MARK_FAILED)
    def close(self) -> None:
        if self._upload_id is None:
            self._s3.put_object(Bucket=self._bucket, Key=self._key, Body=bytes(self._buffer))
            return
        if self._buffer:
            self._send()
        self._s3.complete_multipart_upload(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, MultipartUpload={"Parts": self._pieces}
        )

    def abort(self) -> None:
        # best effort: a step may not be granted it, and the bucket's lifecycle ends what is left
        if self._upload_id is not None:
            with suppress(ClientError):
                self._s3.abort_multipart_upload(Bucket=self._bucket, Key=self._key, UploadId=self._upload_id)


def _windows(sizes: dict[int, int]) -> Iterator[list[int]]:
    """The lines in order, cut into runs whose records add up to at most ASSEMBLY_WINDOW_BYTES
    (a record larger than that alone)."""
    window: list[int] = []
    held = 0
    for line in sorted(sizes):
        if window and held + sizes[line] > ASSEMBLY_WINDOW_BYTES:
            yield window
            window, held = [], 0
        window.append(line)
        held += sizes[line]
    if window:
        yield window


def _window_records(
    fetch: Executor, s3: Any, spec: ShardSpec, keys: list[str], rows: dict[int, _Where], window: list[int]
) -> dict[int, bytes]:
    """The records of a window's lines, each part's read by the one range that holds its rows there;
    a range is let go as soon as its records are copied out."""
    lines_of: dict[int, list[int]] = {}
    for line in window:
        if line in rows:
            lines_of.setdefault(rows[line][0], []).append(line)

    def read(number: int, start: int, end: int) -> tuple[int, int, bytes]:
        return number, start, _range(s3, spec.bucket, keys[number], start, end)

    spans = []
    for number, owned in lines_of.items():
        start = min(rows[line][1] for line in owned)
        end = max(rows[line][2] for line in owned)
        spans.append((end - start, partial(read, number, start, end)))
    records: dict[int, bytes] = {}
    for number, offset, data in _ahead(fetch, spans, IN_FLIGHT_BYTES):
        for line in lines_of[number]:
            _, start, end, _ = rows[line]
            records[line] = data[start - offset : end - offset]
    return records


@causes.caused(causes.SHARD_END)
def assemble_outputs(
    s3: Any,
    spec: ShardSpec,
    *,
    missing_code: str | None = None,
    missing_message: str = "",
    pool: Executor | None = None,
    failure: str | None = None,
) -> ShardStats:
    """Write the shard's results and errors in input order from its parts; return its stats as written.

    With `missing_code`, every request line that has no terminal outcome is written to the
    errors with that code (a failed or cancelled job still accounts for every line).

    The part list is read once and the parts and their figures fetched S3_IN_FLIGHT at a time on
    `pool` (or a pool of its own): a shard at 12.5 requests a second leaves a part every ~37 lines,
    135 parts and 270 objects for 5,000 lines, and one after the other they took seconds. What the
    assembly holds of the outputs is bounded by ASSEMBLY_WINDOW_BYTES, whatever the shard's size.
    """
    rows: dict[int, _Where] = {}
    # the parts as read, while they fit in the window; None once they did not
    held: list[bytes] | None = []
    held_bytes = 0
    stats = Stats()
    results = _Upload(s3, spec.bucket, spec.prefix + "results.jsonl")
    errors = _Upload(s3, spec.bucket, spec.prefix + "errors.jsonl")
    try:
        with s3_pool(pool) as fetch:
            listed = part_objects(s3, spec)
            keys = [key for key, _ in listed]
            with causes.because(causes.PART_READ, count=len(keys), period_s=PART_MAX_AGE_S, every=PART_ROWS_MAX):
                figures = [fetch.submit(part_body, s3, spec.bucket, stats_key(key)) for key in keys]
                reads = [(size, partial(part_body, s3, spec.bucket, key)) for key, size in listed]
                # in the order the parts were written: the first terminal outcome wins; a later copy
                # can only come from a re-sent item
                for number, data in enumerate(_ahead(fetch, reads, IN_FLIGHT_BYTES)):
                    for line, kind, start, end in _spans(data):
                        rows.setdefault(line, (number, start, end, kind == b"r"))
                    held_bytes += len(data)
                    if held_bytes > ASSEMBLY_WINDOW_BYTES:
                        held = None
                    elif held is not None:
                        held.append(data)
            for raw in figures:
                stats.merge(Stats.from_dict(orjson.loads(raw.result())))
            # the custom_id of each line without an outcome; its record is made again as it is
            # written: orjson gives each record a 4 kB buffer, so a shard's records held were
            # 4 kB a line (200 MB for a batch shard of 50,000 lines never sent, four shards at once)
            missing: dict[int, str | None] = {}

            def missing_record(line: int) -> bytes:
                message = f"line {line}: {missing_message}"
                return error_record(spec.job_id, line, missing[line], missing_code or "", message)

            sizes = {line: where[2] - where[1] for line, where in rows.items()}
            if missing_code is not None:
                for item in read_shard_lines(s3, spec):
                    if item.line not in rows:
                        missing[item.line] = item.custom_id
                        sizes[item.line] = len(missing_record(item.line))
                        stats.add_error(missing_code, f"line {item.line}: {missing_message}")
            windows: Iterable[list[int]] = [sorted(sizes)] if held is not None else _windows(sizes)
            for window in windows:
                fetched = _window_records(fetch, s3, spec, keys, rows, window) if held is None else {}
                for line in window:
                    if line in missing:
                        errors.write(missing_record(line))
                        continue
                    number, start, end, ok = rows[line]
                    record = fetched[line] if held is None else memoryview(held[number])[start:end]
                    (results if ok else errors).write(record)
        results.close()
        errors.close()
    except BaseException:
        results.abort()
        errors.abort()
        raise
    shard_stats = ShardStats(
        result_lines=results.lines,
        error_lines=errors.lines,
        results_bytes=results.size,
        errors_bytes=errors.size,
        stats=stats.to_dict(),
        failure=failure,
    )
    s3.put_object(Bucket=spec.bucket, Key=spec.prefix + "stats.json", Body=orjson.dumps(shard_stats.to_json()))
    return shard_stats


def assemble(s3: Any, spec: ShardSpec, *, missing_code: str | None = None, missing_message: str = "") -> Stats:
    """`assemble_outputs`, returning the shard's figures."""
    shard_stats = assemble_outputs(s3, spec, missing_code=missing_code, missing_message=missing_message)
    return Stats.from_dict(shard_stats.stats)
