"""Checkpoint parts: the on-disk format of a shard's terminal outcomes.

Terminal outcomes are checkpointed as part files under `jobs/<job>/shards/<n>/`: a
`part-<run>-<seq>.tsv` of `<line>\t<r|e>\t<output record>` rows plus its figures in
`part-<run>-<seq>.stats.json` (and, where a validating batch shard turned rows down for its
direct pass, their lines and the check each failed in `part-<run>-<seq>.turned.json`). A part is
written whole with one PUT, so the set of lines in parts is exactly the set of lines that must
never be sent again (invariant 3). When the shard is done its parts are assembled into
`results.jsonl` and `errors.jsonl` in input order (`assembly`).

Every mode writes parts through `PartWriter`; merge, the CLI and the modes read them through
`part_keys`, `read_part`, `load_checkpoint` and `parts_stats`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.cache.entries import CacheFill, FilledSegment
from sluice.contract import Mode, ShardStats, causes
from sluice.contract.model import Outcome
from sluice.core.records import error_record, outcome_record
from sluice.formats.lines import LineError
from sluice.providers import family
from sluice.shard.frame import ShardSpec
from sluice.shard.progress import ProgressSink
from sluice.shard.stats import Stats
from sluice.store.jobs import ItemState, JobStore


@dataclass
class Checkpoint:
    """What earlier runs of this shard left behind."""

    done: set[int] = field(default_factory=set)
    runs: int = 0


def part_keys(s3: Any, spec: ShardSpec) -> list[str]:
    """The keys of the shard's parts, in the order they were written."""
    return [key for key, _ in part_objects(s3, spec)]


@causes.under(causes.RUN, causes.SHARD_OUTPUTS, causes.MARK_FAILED)
def part_objects(s3: Any, spec: ShardSpec) -> list[tuple[str, int]]:
    """The shard's parts, (key, size), in the order they were written."""
    found: list[tuple[str, int]] = []
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=spec.bucket, Prefix=spec.prefix + "part-"):
        found.extend((obj["Key"], int(obj["Size"])) for obj in page.get("Contents", []))
    return sorted(item for item in found if item[0].endswith(".tsv"))


# S3 requests one process keeps in flight: botocore's default connection pool holds ten, and at
# a couple of milliseconds of CPU a request against S3's ~20 ms, ten keep Python's one core busy
S3_IN_FLIGHT = 10


@contextmanager
def s3_pool(pool: Executor | None = None, workers: int = S3_IN_FLIGHT) -> Iterator[Executor]:
    """`pool`, or a pool of `workers` threads for S3 requests that ends with the block."""
    if pool is not None:
        yield pool
        return
    own = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="s3")
    try:
        yield own
    finally:
        # a failure leaves no request queued behind it
        own.shutdown(wait=True, cancel_futures=True)


def part_body(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def _rows(data: bytes) -> Iterator[tuple[int, bytes, bytes]]:
    for row in data.splitlines():
        line, kind, record = row.split(b"\t", 2)
        yield int(line), kind, record


def stats_key(part_key: str) -> str:
    return part_key.removesuffix(".tsv") + ".stats.json"


_TURNED = ".turned.json"


@causes.under(causes.RUN)
def turned_down(s3: Any, spec: ShardSpec) -> dict[int, str]:
    """The lines a validating batch shard's batches answered invalid, for its direct pass to send
    again, and the check each failed."""
    lines: dict[int, str] = {}
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=spec.bucket, Prefix=spec.prefix + "part-"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith(_TURNED):
                lines.update((int(k), v) for k, v in orjson.loads(part_body(s3, spec.bucket, obj["Key"])).items())
    return lines


@causes.under(causes.RUN, causes.PART_READ, causes.SHARD_OUTPUTS, causes.MARK_FAILED)
def read_part(s3: Any, bucket: str, key: str) -> Iterator[tuple[int, bytes, bytes]]:
    """(line, kind, output record) per row; kind is `b"r"` for a result and `b"e"` for an error."""
    yield from _rows(part_body(s3, bucket, key))


def parts_stats(s3: Any, spec: ShardSpec) -> Stats:
    """The figures of every part written so far."""
    stats = Stats()
    for key in part_keys(s3, spec):
        stats.merge(Stats.from_dict(orjson.loads(part_body(s3, spec.bucket, stats_key(key)))))
    return stats


def load_checkpoint(s3: Any, spec: ShardSpec) -> Checkpoint:
    checkpoint = Checkpoint()
    for key in part_keys(s3, spec):
        # part-<run>-<seq>.tsv
        run = int(key.rsplit("/", 1)[-1].split("-")[1])
        checkpoint.runs = max(checkpoint.runs, run)
        checkpoint.done.update(line for line, _, _ in read_part(s3, spec.bucket, key))
    return checkpoint


# the run number of the part Plan writes with a shard's cache hits: the shard's own runs come after
CACHED_RUN = 0


@causes.under(causes.PLAN)
def write_cached_part(s3: Any, bucket: str, prefix: str, rows: list[tuple[int, bytes]], stats: Stats) -> None:
    """A shard's cache hits, (line, result record), as a finished part before the shard runs:
    it sends only the rest."""
    base = f"{prefix}part-{CACHED_RUN:05d}-0001"
    s3.put_object(Bucket=bucket, Key=base + ".stats.json", Body=orjson.dumps(stats.to_dict()))
    s3.put_object(Bucket=bucket, Key=base + ".tsv", Body=b"".join(b"%d\tr\t%s\n" % row for row in rows))


def write_answered_shard(s3: Any, bucket: str, prefix: str, rows: list[tuple[int, bytes]], stats: Stats) -> None:
    """The outputs of a shard whose every line the cache answered, (line, result record) in input
    order, as `assemble` writes them: the shard never runs, so it needs no part."""
    write_outputs(s3, bucket, prefix, [r + b"\n" for _, r in rows], [], stats)


PENDING_FLUSH_S = 1.0
PART_MAX_AGE_S = 3.0
# a part holds at most this many outcomes
PART_ROWS_MAX = 1000


@dataclass
class _Chunk:
    opened: float = field(default_factory=time.monotonic)
    rows: list[bytes] = field(default_factory=list)
    items: list[ItemState] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    done: int = 0
    failed: int = 0
    waiting: int = 0
    # answers for the response cache, written with the part (stores written whole)
    cached: FilledSegment | None = None
    # lines turned down for the shard's direct pass, and the check each failed
    turned: dict[int, str] = field(default_factory=dict)


class PartWriter:
    """Checkpoints terminal outcomes as parts: one S3 PUT plus batched item rows each.

    A part is cut every `every` outcomes and written on a background thread while the
    requests go on, so a run that dies loses at most one part and the writes overlap the
    network waits instead of piling up at the end of the run.
    """

    def __init__(
        self,
        *,
        s3: Any,
        store: JobStore,
        spec: ShardSpec,
        run: int,
        every: int = PART_ROWS_MAX,
        item_rows_for_results: bool = True,
        path: str = Mode.DIRECT,
        progress: ProgressSink | None = None,
        cache: CacheFill | None = None,
    ) -> None:
        self._s3 = s3
        self._cache = cache
        # how the outcomes this writer gets were sent, unless add_outcome says otherwise; the
        # Batch API's are priced at the batch rate and have no latency of their own
        self._path = path
        self._progress = progress
        # direct mode keeps item rows for failures only: a result is in the results file, and a
        # row per success was the largest cost of a direct shard
        self._item_rows_for_results = item_rows_for_results
        self._store = store
        self._spec = spec
        self._format = family(spec.provider)
        self._run = run
        self._every = every
        self._seq = 0
        self._chunk = _Chunk()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._writes: list[Future[None]] = []
        self.done = 0
        self.failed = 0
        self.pending = 0

    def add_outcome(self, outcome: Outcome, provider_id: str | None = None, path: str | None = None) -> None:
        chunk = self._chunk
        kind = b"r" if outcome.ok else b"e"
        record = outcome_record(self._spec.job_id, outcome)
        chunk.rows.append(b"%d\t%s\t%s\n" % (outcome.line, kind, record))
        path = path or self._path
        batch = path == Mode.BATCH
        # only an answer that came back on its own request has a latency: a batch's rows, and a
        # background response fetched by a poll, took what the provider's queue and the polling took
        usage = chunk.stats.add_outcome(outcome, path=path, request_format=self._format, timed=path == Mode.DIRECT)
        if self._cache is not None:
            self._cache.add(outcome, record, usage)
        self._count(outcome.ok)
        if self._progress is not None:
            self._progress.outcome(outcome, batch=batch, waited=batch or provider_id is not None)
        # nothing looks up a result that was sent directly by its row (no webhook, no cancel), unless
        # the line has a row already (a background response's, sent again directly): it is marked done
        if outcome.ok and (not self._item_rows_for_results or (path == Mode.DIRECT and provider_id is None)):
            self._maybe_cut(len(chunk.rows))
            return
        chunk.items.append(
            ItemState(
                outcome.line,
                outcome.custom_id,
                "done" if outcome.ok else "failed",
                provider_id=provider_id,
                attempts=outcome.attempts,
                error=None if outcome.ok else f"{outcome.error_code}: {outcome.error_message}",
                swept=outcome.swept,
            )
        )
        self._maybe_cut()

    def add_turned_down(self, line: int, check: str) -> None:
        """An answer the job's checks turned down (`check`) and that is sent again elsewhere (a batch
        row's, by the shard's direct pass): noted for that pass, which carries it to the line's
        outcome, so that it is counted once, there."""
        self._chunk.turned[line] = check

    def add_invalid(self, error: LineError) -> None:
        record = error_record(self._spec.job_id, error.line, error.custom_id, error.code, error.message)
        self._chunk.rows.append(b"%d\te\t%s\n" % (error.line, record))
        self._chunk.stats.add_error(error.code, error.message)
        self._count(False)
        if self._progress is not None:
            self._progress.invalid(error.code)
        self._maybe_cut()

    def add_pending(self, item: ItemState) -> None:
        """An item that is not terminal yet (a background response in flight)."""
        self._chunk.items.append(item)
        self._chunk.waiting += 1
        self.pending += 1
        if self._progress is not None:
            self._progress.waiting(1)
        self._maybe_cut()

    def _count(self, ok: bool) -> None:
        if ok:
            self.done += 1
            self._chunk.done += 1
        else:
            self.failed += 1
            self._chunk.failed += 1

    def _maybe_cut(self, size: int | None = None) -> None:
        full = (size if size is not None else len(self._chunk.items) + len(self._chunk.rows)) >= self._every
        # pending ids are stored within a second, so their webhooks find them; finished work
        # within a few, so progress shows and a cancel keeps it
        age = time.monotonic() - self._chunk.opened
        stale = age > PENDING_FLUSH_S if self._chunk.waiting > 0 else age > PART_MAX_AGE_S and bool(self._chunk.rows)
        if full or stale:
            chunk, self._chunk = self._chunk, _Chunk()
            if self._cache is not None:
                chunk.cached = self._cache.cut()
            self._seq += 1
            self._writes.append(self._pool.submit(self._write, chunk, self._seq, False))

    def _write(self, chunk: _Chunk, seq: int, finished: bool) -> None:
        period_s = PENDING_FLUSH_S if chunk.waiting > 0 else PART_MAX_AGE_S
        with causes.because(causes.PART, period_s=period_s, every=self._every):
            self._write_part(chunk, seq, finished)

    def _write_part(self, chunk: _Chunk, seq: int, finished: bool) -> None:
        spec = self._spec
        period_s = PENDING_FLUSH_S if chunk.waiting > 0 else PART_MAX_AGE_S
        if self._cache is not None:
            writing = causes.because(causes.CACHE_WRITE, period_s=period_s, every=self._every)
            with writing if chunk.cached is not None else nullcontext():
                self._cache.write(chunk.cached)
        base = f"{spec.prefix}part-{self._run:05d}-{seq:04d}"
        if chunk.turned:
            self._s3.put_object(
                Bucket=spec.bucket, Key=base + _TURNED, Body=orjson.dumps(chunk.turned, option=orjson.OPT_NON_STR_KEYS)
            )
        if chunk.rows:
            with causes.because(causes.PART_ROWS, period_s=period_s, every=self._every):
                # stats first: a part without its stats would be counted in results but not in the summary
                stats = orjson.dumps(chunk.stats.to_dict())
                self._s3.put_object(Bucket=spec.bucket, Key=base + ".stats.json", Body=stats)
                self._s3.put_object(Bucket=spec.bucket, Key=base + ".tsv", Body=b"".join(chunk.rows))
        answered = [item.line for item in chunk.items if item.status == "done"]
        if answered:
            with causes.because(causes.PART_ANSWERED, period_s=period_s, every=self._every):
                self._store.record_answered(spec.job_id, spec.shard, self._run, answered)
        self._store.record_progress(
            spec.job_id,
            spec.shard,
            [item for item in chunk.items if item.status != "done"],
            done=chunk.done,
            failed=chunk.failed,
            finished=finished,
            run=self._run,
            waiting=chunk.waiting,
        )
        if chunk.waiting > 0:
            submitted = [i for i in chunk.items if i.status == "submitted"]
            with causes.because(causes.LINE, count=len(submitted)):
                self._store.settle_early(spec.job_id, spec.shard, submitted)

    def flush(self, *, finished: bool, waiting: int = 0) -> None:
        """Write what is left once every earlier part is safely stored (their errors surface here)."""
        try:
            for write in self._writes:
                write.result()
            self._chunk.waiting += waiting
            if self._cache is not None:
                self._chunk.cached = self._cache.cut(last=True)
            self._seq += 1
            self._write(self._chunk, self._seq, finished)
        finally:
            if self._cache is not None:
                self._cache.close()
            self._chunk = _Chunk()
            self._writes.clear()
            self._pool.shutdown(wait=True)

    async def aflush(self, *, finished: bool, waiting: int = 0) -> None:
        """`flush` without blocking the event loop."""
        await asyncio.to_thread(self.flush, finished=finished, waiting=waiting)


@causes.under(causes.PLAN, causes.SHARD_END, causes.SHARD_FAILED, causes.MARK_FAILED)
def write_outputs(
    s3: Any, bucket: str, prefix: str, results: list[bytes], errors: list[bytes], stats: Stats
) -> ShardStats:
    """A finished shard's results and errors (lines in input order), then its stats: the line
    counts are what Merge checks against the plan (every line accounted for), and the sizes
    spare Merge a HEAD of each file. Returns the stats as written."""
    results_body, errors_body = b"".join(results), b"".join(errors)
    s3.put_object(Bucket=bucket, Key=prefix + "results.jsonl", Body=results_body)
    s3.put_object(Bucket=bucket, Key=prefix + "errors.jsonl", Body=errors_body)
    shard_stats = ShardStats(
        result_lines=len(results),
        error_lines=len(errors),
        results_bytes=len(results_body),
        errors_bytes=len(errors_body),
        stats=stats.to_dict(),
    )
    s3.put_object(Bucket=bucket, Key=prefix + "stats.json", Body=orjson.dumps(shard_stats.to_json()))
    return shard_stats
