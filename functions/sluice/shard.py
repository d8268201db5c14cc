"""One shard: read its byte range, send what has no terminal result yet, checkpoint, assemble.

Terminal outcomes are checkpointed as part files under `jobs/<job>/shards/<n>/`; a part is
written whole with one PUT, so the set of lines in parts is exactly the set of lines that
must never be sent again (invariant 3). When the shard is done its parts are assembled into
`results.jsonl` and `errors.jsonl` in input order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from .background import Settled, poll_request, settle, submit_request
from .engine import EngineSettings, EngineStats, fan_out
from .lines import LineError, parse_line, split_lines
from .model import BACKGROUND_URLS, ErrorCode, Outcome, Request
from .progress import ProgressSink
from .records import error_record, outcome_record
from .retry import RetryPolicy
from .settings import Settings
from .stats import Stats
from .store import ItemState, JobStore

READ_CHUNK = 1 << 20
# A background response still running after this long is reported expired: every wait loop
# adds history events to the shard's execution, which AWS caps at 25,000.
BACKGROUND_MAX_WAIT_S = 24 * 3600.0


def poll_wait_seconds(settings: Settings, elapsed_s: float) -> int:
    """How long a shard sleeps before it polls again. Webhooks end the wait as soon as the work
    ends, so polling only reconciles, and backs off as the work ages: each wait is a tenth of
    the time waited so far, between `poll_seconds` and `batch_poll_max_s`. Over 24 hours that
    is about 330 loops, where a fixed 10 s would be 8,640 (and 25,000 history events in 5 hours)."""
    return int(max(settings.poll_seconds, min(settings.batch_poll_max_s, elapsed_s / 10)))


class ShardStalled(RuntimeError):
    """A run ended before sending anything: the Lambda timeout leaves no room for a request."""


@dataclass(frozen=True)
class ShardSpec:
    job_id: str
    shard: int
    bucket: str
    key: str
    etag: str
    start: int
    end: int
    first_line: int
    lines: int
    mode: str
    concurrency: int
    max_attempts: int
    model: str | None = None
    # the environment's model for a line that names none (`Settings.default_model`)
    default_model: str | None = None
    rpm: float = 0
    tpm: float = 0
    duplicates_key: str | None = None
    blank: int = 0
    # batch mode: rows a batch did not finish are re-run directly ("direct") or reported ("error")
    on_batch_incomplete: str = "direct"
    # background mode: when the shard first waited for its responses (epoch seconds)
    waiting_since: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardSpec:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def last_line(self) -> int:
        return self.first_line + self.lines - 1

    @property
    def prefix(self) -> str:
        return f"jobs/{self.job_id}/shards/{self.shard:05d}/"

    @property
    def results_key(self) -> str:
        return self.prefix + "results.jsonl"

    @property
    def errors_key(self) -> str:
        return self.prefix + "errors.jsonl"

    @property
    def stats_key(self) -> str:
        return self.prefix + "stats.json"

    @property
    def batch_report_key(self) -> str:
        """What the shard's batches did, for the summary (batch mode only)."""
        return self.prefix + "batch.json"


@dataclass
class Checkpoint:
    """What earlier runs of this shard left behind."""

    done: set[int] = field(default_factory=set)
    runs: int = 0


def _part_keys(s3: Any, spec: ShardSpec) -> list[str]:
    keys: list[str] = []
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=spec.bucket, Prefix=spec.prefix + "part-"):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return sorted(k for k in keys if k.endswith(".tsv"))


def _read_part(s3: Any, bucket: str, key: str) -> Iterator[tuple[int, bytes, bytes]]:
    data = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    for row in data.splitlines():
        line, kind, record = row.split(b"\t", 2)
        yield int(line), kind, record


def parts_stats(s3: Any, spec: ShardSpec) -> Stats:
    """The figures of every part written so far."""
    stats = Stats()
    for key in _part_keys(s3, spec):
        raw = s3.get_object(Bucket=spec.bucket, Key=key.removesuffix(".tsv") + ".stats.json")["Body"].read()
        stats.merge(Stats.from_dict(orjson.loads(raw)))
    return stats


def load_checkpoint(s3: Any, spec: ShardSpec) -> Checkpoint:
    checkpoint = Checkpoint()
    for key in _part_keys(s3, spec):
        # part-<run>-<seq>.tsv
        run = int(key.rsplit("/", 1)[-1].split("-")[1])
        checkpoint.runs = max(checkpoint.runs, run)
        checkpoint.done.update(line for line, _, _ in _read_part(s3, spec.bucket, key))
    return checkpoint


def read_shard(s3: Any, spec: ShardSpec) -> Iterator[Request | LineError]:
    """The shard's lines, validated, straight from its byte range of the input object."""
    duplicates: dict[int, int] = {}
    if spec.duplicates_key:
        raw = s3.get_object(Bucket=spec.bucket, Key=spec.duplicates_key)["Body"].read()
        duplicates = {int(k): v for k, v in orjson.loads(raw).items()}
    body = s3.get_object(
        Bucket=spec.bucket, Key=spec.key, Range=f"bytes={spec.start}-{spec.end - 1}", IfMatch=spec.etag
    )["Body"]
    for offset, raw in enumerate(split_lines(body.iter_chunks(READ_CHUNK))):
        number = spec.first_line + offset
        parsed = parse_line(raw, number, model=spec.model, default_model=spec.default_model)
        if parsed is None:
            continue
        if isinstance(parsed, LineError):
            yield parsed
        elif number in duplicates:
            yield LineError(
                number,
                ErrorCode.DUPLICATE_CUSTOM_ID,
                f"line {number}: duplicate custom_id {parsed.custom_id!r} (first on line {duplicates[number]})",
                parsed.custom_id,
            )
        else:
            yield parsed


PENDING_FLUSH_S = 1.0
PART_MAX_AGE_S = 3.0


@dataclass
class _Chunk:
    opened: float = field(default_factory=time.monotonic)
    rows: list[bytes] = field(default_factory=list)
    items: list[ItemState] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    done: int = 0
    failed: int = 0
    waiting: int = 0


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
        every: int = 1000,
        item_rows_for_results: bool = True,
        path: str = "direct",
        progress: ProgressSink | None = None,
    ) -> None:
        self._s3 = s3
        # how the outcomes this writer gets were sent, unless add_outcome says otherwise; the
        # Batch API's are priced at the batch rate and have no latency of their own
        self._path = path
        self._progress = progress
        # direct mode keeps item rows for failures only: a result is in the results file, and a
        # row per success was the largest cost of a direct shard
        self._item_rows_for_results = item_rows_for_results
        self._store = store
        self._spec = spec
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
        chunk.rows.append(b"%d\t%s\t%s\n" % (outcome.line, kind, outcome_record(self._spec.job_id, outcome)))
        path = path or self._path
        batch = path == "batch"
        chunk.stats.add_outcome(outcome, path=path, timed=not batch)
        self._count(outcome.ok)
        if self._progress is not None:
            self._progress.outcome(outcome, batch=batch, waited=batch or provider_id is not None)
        # nothing looks up a result that was sent directly by its row (no webhook, no cancel)
        if outcome.ok and (not self._item_rows_for_results or path == "direct"):
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
            )
        )
        self._maybe_cut()

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
            self._seq += 1
            self._writes.append(self._pool.submit(self._write, chunk, self._seq, False))

    def _write(self, chunk: _Chunk, seq: int, finished: bool) -> None:
        spec = self._spec
        if chunk.rows:
            # stats first: a part without its stats would be counted in results but not in the summary
            base = f"{spec.prefix}part-{self._run:05d}-{seq:04d}"
            self._s3.put_object(Bucket=spec.bucket, Key=base + ".stats.json", Body=orjson.dumps(chunk.stats.to_dict()))
            self._s3.put_object(Bucket=spec.bucket, Key=base + ".tsv", Body=b"".join(chunk.rows))
        self._store.record_progress(
            spec.job_id,
            spec.shard,
            chunk.items,
            done=chunk.done,
            failed=chunk.failed,
            finished=finished,
            run=self._run,
            waiting=chunk.waiting,
        )
        if chunk.waiting > 0:
            self._store.settle_early(spec.job_id, spec.shard, [i for i in chunk.items if i.status == "submitted"])

    def flush(self, *, finished: bool, waiting: int = 0) -> None:
        """Write what is left once every earlier part is safely stored (their errors surface here)."""
        try:
            for write in self._writes:
                write.result()
            self._chunk.waiting += waiting
            self._seq += 1
            self._write(self._chunk, self._seq, finished)
        finally:
            self._chunk = _Chunk()
            self._writes.clear()
            self._pool.shutdown(wait=True)

    async def aflush(self, *, finished: bool, waiting: int = 0) -> None:
        """`flush` without blocking the event loop."""
        await asyncio.to_thread(self.flush, finished=finished, waiting=waiting)


def assemble(s3: Any, spec: ShardSpec, *, missing_code: str | None = None, missing_message: str = "") -> Stats:
    """Write the shard's results and errors in input order from its parts.

    With `missing_code`, every request line that has no terminal outcome is written to the
    errors with that code (a failed or cancelled job still accounts for every line).
    """
    rows: dict[int, tuple[bytes, bytes]] = {}
    stats = Stats()
    for key in _part_keys(s3, spec):
        for line, kind, record in _read_part(s3, spec.bucket, key):
            # the first terminal outcome wins; a later copy can only come from a re-sent item
            rows.setdefault(line, (kind, record))
        stats_raw = s3.get_object(Bucket=spec.bucket, Key=key.removesuffix(".tsv") + ".stats.json")["Body"].read()
        stats.merge(Stats.from_dict(orjson.loads(stats_raw)))
    if missing_code is not None:
        for item in read_shard(s3, spec):
            if item.line not in rows:
                record = error_record(
                    spec.job_id, item.line, item.custom_id, missing_code, f"line {item.line}: {missing_message}"
                )
                rows[item.line] = (b"e", record)
                stats.add_error(missing_code, f"line {item.line}: {missing_message}")
    results = [rows[n][1] + b"\n" for n in sorted(rows) if rows[n][0] == b"r"]
    errors = [rows[n][1] + b"\n" for n in sorted(rows) if rows[n][0] == b"e"]
    s3.put_object(Bucket=spec.bucket, Key=spec.results_key, Body=b"".join(results))
    s3.put_object(Bucket=spec.bucket, Key=spec.errors_key, Body=b"".join(errors))
    # the line counts are what Merge checks against the plan: every line accounted for
    shard_stats = {"result_lines": len(results), "error_lines": len(errors), "stats": stats.to_dict()}
    s3.put_object(Bucket=spec.bucket, Key=spec.stats_key, Body=orjson.dumps(shard_stats))
    return stats


@dataclass
class ShardContext:
    """What a shard run needs from outside; handlers build it, tests pass fakes."""

    s3: Any
    store: JobStore
    settings: Settings
    api_key: str
    remaining_s: Callable[[], float]
    session_factory: Callable[[int], aiohttp.ClientSession]
    # in-process listener for live progress (the local cloud's display); deployed, there is none
    progress: ProgressSink | None = None


def _engine_settings(spec: ShardSpec, settings: Settings) -> EngineSettings:
    policy = RetryPolicy(
        max_attempts=spec.max_attempts,
        request_timeout_s=settings.request_timeout_s,
        base_delay_s=settings.retry_base_delay_s,
    )
    return EngineSettings(concurrency=spec.concurrency, policy=policy, rpm=spec.rpm, tpm=spec.tpm)


def _margin_s(ctx: ShardContext) -> float:
    return ctx.settings.request_timeout_s + ctx.settings.safety_margin_s


CANCEL_CHECK_S = 5.0


class Stopper:
    """When a run stops taking items: the Lambda's time is nearly up, or the job was cancelled.

    Stopping the execution does not stop a Lambda that is already running, so the run looks
    at the job row every few seconds and stops sending once `sluice cancel` has marked it.
    """

    def __init__(self, ctx: ShardContext, job_id: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._ctx = ctx
        self._job_id = job_id
        self._clock = clock
        self._margin = _margin_s(ctx)
        self._next_check = clock() + CANCEL_CHECK_S
        self.cancelled = False

    def __call__(self) -> bool:
        if self._ctx.remaining_s() < self._margin:
            return True
        now = self._clock()
        if not self.cancelled and now >= self._next_check:
            self._next_check = now + CANCEL_CHECK_S
            self.cancelled = (self._ctx.store.job(self._job_id) or {}).get("status") == "CANCELLED"
        return self.cancelled


async def _fan_out(
    ctx: ShardContext,
    spec: ShardSpec,
    requests: Iterable[Request],
    sink: Callable[[Outcome], None],
    stopper: Stopper | None = None,
) -> EngineStats:
    async with ctx.session_factory(spec.concurrency) as session:
        return await fan_out(
            requests,
            session=session,
            base_url=ctx.settings.provider_base_url,
            api_key=ctx.api_key,
            settings=_engine_settings(spec, ctx.settings),
            sink=sink,
            should_stop=stopper or Stopper(ctx, spec.job_id),
            count_remaining=False,
        )


def _pending(spec: ShardSpec, writer: PartWriter, skip: set[int], s3: Any) -> Iterator[Request]:
    """Requests still to send; invalid lines go straight to the errors as they stream past."""
    for item in read_shard(s3, spec):
        if item.line in skip:
            continue
        if isinstance(item, LineError):
            writer.add_invalid(item)
        else:
            yield item


async def run_direct(ctx: ShardContext, spec: ShardSpec) -> dict[str, Any]:
    started = time.monotonic()
    checkpoint = load_checkpoint(ctx.s3, spec)
    writer = PartWriter(
        s3=ctx.s3,
        store=ctx.store,
        spec=spec,
        run=checkpoint.runs + 1,
        item_rows_for_results=False,
        progress=ctx.progress,
    )
    stopper = Stopper(ctx, spec.job_id)
    stats = await _fan_out(ctx, spec, _pending(spec, writer, checkpoint.done, ctx.s3), writer.add_outcome, stopper)
    finished = not stats.stopped_early
    if stopper.cancelled:
        await writer.aflush(finished=False)
        return {"done": False, "cancelled": True, "run": checkpoint.runs + 1, "sent": writer.done + writer.failed}
    if not finished and stats.sent == 0:
        raise ShardStalled(
            f"shard {spec.shard} stopped before sending anything: {ctx.remaining_s():.0f} s left is under the "
            f"request timeout plus safety margin ({_margin_s(ctx):.0f} s)"
        )
    await writer.aflush(finished=finished)
    if finished:
        assemble(ctx.s3, spec)
    return {
        "done": finished,
        "run": checkpoint.runs + 1,
        "sent": writer.done + writer.failed,
        "seconds": round(time.monotonic() - started, 3),
    }


async def submit_background(ctx: ShardContext, spec: ShardSpec) -> dict[str, Any]:
    """Create a background response per pending line and remember its id in the item row.

    Lines for an endpoint with no background form (chat completions, embeddings, completions)
    are sent directly instead: their answer is final the moment it arrives.
    """
    checkpoint = load_checkpoint(ctx.s3, spec)
    skip = set(checkpoint.done)
    skip.update(i.line for i in ctx.store.items(spec.job_id, spec.first_line, spec.last_line) if i.provider_id)
    writer = PartWriter(
        s3=ctx.s3, store=ctx.store, spec=spec, run=checkpoint.runs + 1, path="background", progress=ctx.progress
    )
    # lines in flight that were sent directly; a set of the in-flight ones only
    direct: set[int] = set()

    def prepare(request: Request) -> Request:
        if request.path in BACKGROUND_URLS:
            return submit_request(request)
        direct.add(request.line)
        return request

    def sink(outcome: Outcome) -> None:
        if outcome.line in direct:
            direct.discard(outcome.line)
            writer.add_outcome(outcome, path="direct")
            return
        if not outcome.ok or not isinstance(outcome.body, dict):
            writer.add_outcome(outcome)
            return
        settled = settle(outcome.body)
        if settled is not None:
            writer.add_outcome(_settled_outcome(outcome, settled))
            return
        writer.add_pending(
            ItemState(outcome.line, outcome.custom_id, "submitted", str(outcome.body.get("id")), outcome.attempts)
        )

    requests = (prepare(r) for r in _pending(spec, writer, skip, ctx.s3))
    stats = await _fan_out(ctx, spec, requests, sink)
    await writer.aflush(finished=False)
    return {
        "submitted": not stats.stopped_early,
        "run": checkpoint.runs + 1,
        "wait_seconds": ctx.settings.poll_seconds,
        "waiting_since": spec.waiting_since or time.time(),
    }


def _settled_outcome(outcome: Outcome, settled: Any) -> Outcome:
    return Outcome(
        line=outcome.line,
        custom_id=outcome.custom_id,
        status_code=outcome.status_code,
        body=settled.body,
        request_id=outcome.request_id,
        error_code=settled.error_code,
        error_message=settled.error_message,
        attempts=outcome.attempts,
        latency_s=outcome.latency_s,
        throttled=outcome.throttled,
    )


async def collect_background(ctx: ShardContext, spec: ShardSpec) -> dict[str, Any]:
    """Poll every submitted response once; settle the finished ones, keep waiting for the rest."""
    checkpoint = load_checkpoint(ctx.s3, spec)
    waiting = {
        i.line: i
        for i in ctx.store.items(spec.job_id, spec.first_line, spec.last_line)
        if i.status in ("submitted", "settled") and i.provider_id and i.line not in checkpoint.done
    }
    writer = PartWriter(
        s3=ctx.s3, store=ctx.store, spec=spec, run=checkpoint.runs + 1, path="background", progress=ctx.progress
    )
    still: list[int] = []
    # items a webhook settled were already counted off the shard's wait; the rest are counted here
    unsettled_done = 0
    elapsed = time.time() - (spec.waiting_since or time.time())
    expired = elapsed > BACKGROUND_MAX_WAIT_S

    def sink(outcome: Outcome) -> None:
        nonlocal unsettled_done
        if outcome.ok and isinstance(outcome.body, dict):
            settled = settle(outcome.body)
            if settled is None and not expired:
                still.append(outcome.line)
                return
            if settled is None:
                hours = BACKGROUND_MAX_WAIT_S / 3600
                message = f"background response still {outcome.body.get('status')} after {hours:g} hours"
                settled = Settled(str(outcome.body.get("status")), outcome.body, ErrorCode.EXPIRED, message)
            outcome = _settled_outcome(outcome, settled)
        item = waiting[outcome.line]
        outcome.attempts += item.attempts
        unsettled_done += item.status == "submitted"
        writer.add_outcome(outcome, provider_id=item.provider_id)

    requests = [poll_request(i.line, i.custom_id, i.provider_id or "") for i in waiting.values()]
    stats = await _fan_out(ctx, spec, requests, sink)
    left = len(still) + stats.remaining
    finished = left == 0 and not stats.stopped_early
    await writer.aflush(finished=finished, waiting=-unsettled_done)
    if finished:
        assemble(ctx.s3, spec)
    return {"done": finished, "waiting": left, "wait_seconds": poll_wait_seconds(ctx.settings, elapsed)}
