"""Batch mode: a shard's rows go through the provider's Files and Batch APIs.

SubmitBatch cuts the rows that have no terminal outcome yet into JSONL files — one endpoint
and one model per file, within the provider's request and byte limits and its model's Batch
queue limit — and creates a batch per file for as many files as the queue has room for
(`batch_queue`: tokens are reserved in the table first, since every shard of every job on the
key shares the queue). CollectBatch streams back the output and error files of the batches
that ended and writes their outcomes as shard parts, exactly like a direct run, so checkpoints,
assembly and merge work unchanged; then it creates the files still waiting, as the ended
batches made room. A batch the provider failed with `token_limit_exceeded` answered nothing:
its file goes back to waiting and is created again after a backoff, under a new attempt number.
Rows a batch did not finish get no outcome when the job's policy is `direct` (RunShard then
sends them, as it sends every line missing from the parts), or an error line when it is `error`.

Which input line a batch row answers is kept in S3 per batch file (`batch-<part>.json`), written
for every file before any batch exists: providers return rows in any order, validation errors
name rows by their line in the uploaded file, and a file created later is rebuilt from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any, Literal, cast

import openai
import orjson

from . import batch_queue
from .batch_queue import HOLD_MAX_S, Hold, estimate_tokens, limit_exceeded, queue_key
from .batch_queue_table import QueueTable
from .budget import Budget, worst_case_nano
from .cache import fill_for
from .contract import Settings
from .model import ErrorCode, Outcome, Request
from .parts import PartWriter, assemble, load_checkpoint, parts_stats
from .retry import RetryPolicy, backoff_s
from .shard import ShardContext, ShardSpec, pending, poll_wait_seconds, read_shard, shard_budget, unsent
from .store import QUEUED_PREFIX

COMPLETION_WINDOW: Literal["24h"] = "24h"
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
# error codes a provider puts on rows it never ran: these rows follow the job's policy
UNFINISHED_CODES = frozenset({ErrorCode.BATCH_EXPIRED, ErrorCode.BATCH_CANCELLED})
# the code for a row left unfinished, by how its batch ended
_LEFTOVER_CODE = {
    "expired": ErrorCode.BATCH_EXPIRED,
    "cancelled": ErrorCode.BATCH_CANCELLED,
    "failed": ErrorCode.BATCH_FAILED,
    "completed": ErrorCode.BATCH_FAILED,
}
# the SDK retries 408/409/429/5xx and lost connections itself, with backoff and Retry-After
SDK_MAX_RETRIES = 5
# ...except for creating a batch, which has no idempotency key: a lost answer may hide a batch
# that exists, so each attempt looks for it before trying again
CREATE_POLICY = RetryPolicy(max_attempts=5, base_delay_s=1.0)
# equal jitter (at least half of each step): a shard creates its batches alone, so there is
# no crowd to spread out, and every attempt lists the provider's batches first
CREATE_JITTER_FLOOR = 0.5
_AMBIGUOUS = (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError)
# a 200 MB upload needs far longer than one inference call
UPLOAD_TIMEOUT_S = 600.0
# provider and Lambda clocks differ; a retried submit looks this far before its first attempt
CLOCK_SLACK_S = 600
# a batch file stays in memory up to this size, then spills to /tmp
SPOOL_BYTES = 8 << 20
_EXCERPT = 300


@dataclass
class BatchPart:
    """One batch input file: a single endpoint and model, within the provider's limits."""

    index: int
    endpoint: str
    model: str | None
    lines: list[int] = field(default_factory=list)
    custom_ids: list[str] = field(default_factory=list)
    size: int = 0
    # input tokens the provider's queue will count (`batch_queue.estimate_tokens`)
    tokens: int = 0
    file: IO[bytes] | None = None

    def add(self, request: Request, row: bytes) -> None:
        if self.file is None:
            # open across calls and closed by close(): the submit holds every part until it uploads it
            self.file = cast(IO[bytes], tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))  # noqa: SIM115
        self.file.write(row)
        self.lines.append(request.line)
        self.custom_ids.append(request.custom_id)
        self.size += len(row)
        self.tokens += estimate_tokens(request)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def content(self) -> bytes:
        """The whole file (tests and small parts); uploads stream `file` instead."""
        if self.file is None:
            return b""
        self.file.seek(0)
        return self.file.read()

    def manifest(self) -> bytes:
        return orjson.dumps(
            {
                "index": self.index,
                "endpoint": self.endpoint,
                "model": self.model,
                "lines": self.lines,
                "custom_ids": self.custom_ids,
                "tokens": self.tokens,
            }
        )

    @classmethod
    def from_manifest(cls, raw: bytes) -> BatchPart:
        data = orjson.loads(raw)
        return cls(
            index=data["index"],
            endpoint=data["endpoint"],
            model=data["model"],
            lines=data["lines"],
            custom_ids=data["custom_ids"],
            tokens=int(data.get("tokens", 0)),
        )


def part_key(spec: ShardSpec, index: int) -> str:
    return f"{spec.prefix}batch-{index:05d}.json"


def batch_row(request: Request) -> bytes:
    """The request as a Batch API input line; the body bytes pass through untouched."""
    return b'{"custom_id":%s,"method":"POST","url":%s,"body":%s}\n' % (
        orjson.dumps(request.custom_id),
        orjson.dumps(request.path),
        request.body or b"{}",
    )


def request_model(request: Request) -> str | None:
    if not request.body:
        return None
    model = orjson.loads(request.body).get("model")
    return model if isinstance(model, str) else None


def split_parts(
    requests: Iterable[Request],
    *,
    max_requests: int,
    max_bytes: int,
    max_tokens: Callable[[str | None], int] | None = None,
) -> list[BatchPart]:
    """Cut the requests into batch files: one per (endpoint, model), a new one at any limit:
    requests, bytes, or the model's queue limit in tokens (`max_tokens`, 0 = none), since a
    file over the queue limit could never be enqueued.

    Deterministic for the same requests, so a retried submit numbers its parts the same way
    and recognises the batches it created before.
    """
    parts: list[BatchPart] = []
    current: dict[tuple[str, str | None], BatchPart] = {}
    limits: dict[str | None, int] = {}
    for request in requests:
        row = batch_row(request)
        group = (request.path, request_model(request))
        if group[1] not in limits:
            limits[group[1]] = max_tokens(group[1]) if max_tokens is not None else 0
        limit = limits[group[1]]
        part = current.get(group)
        full = part is not None and (
            len(part.lines) >= max_requests
            or (
                part.lines
                and (part.size + len(row) > max_bytes or (limit > 0 and part.tokens + estimate_tokens(request) > limit))
            )
        )
        if part is None or full:
            part = BatchPart(index=len(parts), endpoint=group[0], model=group[1])
            parts.append(part)
            current[group] = part
        part.add(request, row)
    return parts


def batch_wait_seconds(settings: Settings, elapsed_s: float) -> int:
    """How long AwaitBatch sleeps before polling (batches take minutes to hours)."""
    return poll_wait_seconds(settings, elapsed_s)


@contextlib.asynccontextmanager
async def _provider(ctx: ShardContext, client: openai.AsyncOpenAI | None) -> AsyncIterator[openai.AsyncOpenAI]:
    if client is not None:
        yield client
        return
    async with openai.AsyncOpenAI(
        base_url=ctx.settings.provider_base_url,
        api_key=ctx.api_key,
        max_retries=SDK_MAX_RETRIES,
        timeout=ctx.settings.request_timeout_s,
    ) as api:
        yield api


def _attempt(metadata: dict[str, Any]) -> int:
    raw = str(metadata.get("try", "1"))
    return int(raw) if raw.isdigit() else 0


async def _created_batches(api: openai.AsyncOpenAI, spec: ShardSpec, since: float) -> dict[tuple[int, int], str]:
    """Batches an earlier attempt of this shard created, by (part, attempt), from their metadata.

    Listed newest first, so the scan stops at the first batch older than that attempt.
    """
    found: dict[tuple[int, int], str] = {}
    async for batch in api.batches.list(limit=100):
        if batch.created_at < since:
            break
        metadata = batch.metadata or {}
        part = metadata.get("part", "")
        if metadata.get("job") == spec.job_id and metadata.get("shard") == str(spec.shard) and part.isdigit():
            # a second copy should not exist; if one does, the older one is the one recorded
            found[(int(part), _attempt(metadata))] = batch.id
    return found


async def _listed_batches(
    api: openai.AsyncOpenAI, since: float
) -> dict[tuple[str, int], dict[tuple[int, int], batch_queue.Listed]]:
    """The key's Sluice batches created since `since`, as the queue's reconciling reads them."""
    listed = []
    async for batch in api.batches.list(limit=100):
        if batch.created_at < since:
            break
        listed.append(batch)
    return batch_queue.listed_batches(listed)


def _metadata(spec: ShardSpec, index: int, attempt: int) -> dict[str, str]:
    metadata = {"job": spec.job_id, "shard": str(spec.shard), "part": str(index)}
    if attempt > 1:
        # a file created again after `token_limit_exceeded`: the failed batch stays listed
        metadata["try"] = str(attempt)
    return metadata


class QueueFull(Exception):
    """The provider refused to create a batch because its queue is full: try again later."""


async def _create(api: openai.AsyncOpenAI, ctx: ShardContext, spec: ShardSpec, part: BatchPart, attempt: int) -> str:
    assert part.file is not None
    part.file.seek(0)
    name = f"sluice-{spec.job_id}-{spec.shard:05d}-{part.index:03d}.jsonl"
    uploaded = await api.files.create(
        file=(name, part.file, "application/jsonl"), purpose="batch", timeout=UPLOAD_TIMEOUT_S
    )
    started = time.time()
    once = api.with_options(max_retries=0)
    tries = 0
    while True:
        tries += 1
        try:
            batch = await once.batches.create(
                input_file_id=uploaded.id,
                endpoint=cast(Any, part.endpoint),
                completion_window=COMPLETION_WINDOW,
                metadata=_metadata(spec, part.index, attempt),
            )
            return batch.id
        except openai.APIError as exc:
            if getattr(exc, "code", None) == batch_queue.TOKEN_LIMIT_EXCEEDED:
                # refused outright rather than failed at validation: the same "wait and resubmit"
                with contextlib.suppress(openai.APIError):
                    await api.files.delete(uploaded.id)
                raise QueueFull(str(exc)) from exc
            if not isinstance(exc, _AMBIGUOUS):
                raise
            failure = exc
        found = await _created_batches(api, spec, since=started - CLOCK_SLACK_S)
        if (part.index, attempt) in found:
            return found[(part.index, attempt)]
        if tries >= CREATE_POLICY.max_attempts:
            raise failure
        await asyncio.sleep(backoff_s(tries, CREATE_POLICY, random.random, floor=CREATE_JITTER_FLOOR))


@dataclass
class ShardBatches:
    """A batch shard's files as its row records them: a batch id per file ("" while it waits
    for room in the queue), each file's model and tokens, and attempt numbers."""

    batch_ids: list[str]
    models: list[str]
    tokens: list[int]
    lines: list[int]
    tries: dict[str, int]
    retry_at: float = 0.0
    requeued: int = 0

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ShardBatches:
        plan = list(row.get("batch_parts") or [])
        batch_ids = list(row.get("batch_ids") or [])
        batch_ids += [""] * (len(plan) - len(batch_ids))
        return cls(
            batch_ids=batch_ids,
            models=[str(p.get("model") or "") for p in plan],
            tokens=[int(p.get("tokens", 0)) for p in plan],
            lines=[int(p.get("lines", 0)) for p in plan],
            tries={str(k): int(v) for k, v in dict(row.get("batch_tries") or {}).items()},
            retry_at=float(row.get("batch_retry_at") or 0.0),
            requeued=int(row.get("batch_requeued") or 0),
        )

    def attempt(self, index: int) -> int:
        return self.tries.get(str(index), 1)

    def waiting_for_room(self) -> list[int]:
        return [index for index, batch_id in enumerate(self.batch_ids) if not batch_id]


def _rebuild(ctx: ShardContext, spec: ShardSpec, indexes: list[int]) -> list[BatchPart]:
    """The files of parts created after SubmitBatch, from their row maps and the shard's input."""
    maps = {
        index: BatchPart.from_manifest(ctx.s3.get_object(Bucket=spec.bucket, Key=part_key(spec, index))["Body"].read())
        for index in indexes
    }
    owner = {line: index for index, part in maps.items() for line in part.lines}
    rebuilt = {index: BatchPart(index=index, endpoint=part.endpoint, model=part.model) for index, part in maps.items()}
    for item in read_shard(ctx.s3, spec):
        index = owner.get(item.line)
        if index is not None and isinstance(item, Request):
            rebuilt[index].add(item, batch_row(item))
    for index, part in rebuilt.items():
        if part.lines != maps[index].lines:
            raise RuntimeError(f"part {index} of shard {spec.shard} no longer matches its row map")
    return [rebuilt[index] for index in indexes]


def _requeue_delay_s(settings: Settings, attempt: int) -> float:
    """How long a file the queue refused waits before its next attempt: doubling, up to the poll cap."""
    policy = RetryPolicy(base_delay_s=float(settings.poll_seconds), max_delay_s=float(settings.batch_poll_max_s))
    return backoff_s(attempt, policy, random.random, floor=CREATE_JITTER_FLOOR)


def _requeue(ctx: ShardContext, spec: ShardSpec, state: ShardBatches, index: int) -> None:
    state.batch_ids[index] = ""
    attempt = state.attempt(index)
    state.tries[str(index)] = attempt + 1
    state.retry_at = max(state.retry_at, time.time() + _requeue_delay_s(ctx.settings, attempt))
    state.requeued += 1
    ctx.store.requeue_batch(spec.job_id, spec.shard, state.batch_ids, state.tries, state.retry_at)


async def _advance(
    api: openai.AsyncOpenAI,
    ctx: ShardContext,
    spec: ShardSpec,
    state: ShardBatches,
    files: dict[int, BatchPart] | None,
    queue: QueueTable,
) -> int:
    """Create the waiting files that fit under their model's queue limit, in part order; how many.

    A file goes only once its tokens are reserved. A reservation this shard already held means
    an earlier run may have created the batch and died before recording it: it is looked up first.
    """
    waiting = state.waiting_for_room()
    if not waiting or time.time() < state.retry_at:
        return 0
    if ctx.store.stop_mark(spec.job_id, spec.shard):
        # the job was cancelled or has failed: nothing new goes to the provider
        return 0
    settings = ctx.settings
    full: set[str] = set()
    reconciled: set[str] = set()
    granted: list[int] = []
    for index in waiting:
        model = state.models[index]
        if model in full:
            continue
        name = queue_key(settings.provider_base_url, ctx.api_key, model)
        hold = Hold(spec.job_id, spec.shard, index, state.attempt(index))
        limit = settings.batch_queue_limit(model or None)
        got = queue.reserve(name, hold, state.tokens[index], limit)
        if not got.granted and model not in reconciled and queue.claim_reconcile(name, got.checked):
            # holds of shards that died are released here, from the provider's own list
            reconciled.add(model)
            listed = await _listed_batches(api, since=time.time() - HOLD_MAX_S - CLOCK_SLACK_S)
            if queue.forget(name, listed):
                got = queue.reserve(name, hold, state.tokens[index], limit)
        if not got.granted:
            full.add(model)
            continue
        if got.held_since is not None:
            found = await _created_batches(api, spec, since=got.held_since - CLOCK_SLACK_S)
            batch_id = found.get((index, state.attempt(index)))
            if batch_id is not None:
                state.batch_ids[index] = batch_id
                ctx.store.set_shard_batches(spec.job_id, spec.shard, state.batch_ids)
                continue
        granted.append(index)
    if not granted:
        return 0
    parts = _rebuild(ctx, spec, granted) if files is None else [files[index] for index in granted]

    def release(index: int) -> None:
        queue.release(Hold(spec.job_id, spec.shard, index, state.attempt(index)))

    created = 0
    try:
        for position, part in enumerate(parts):
            attempt = state.attempt(part.index)
            try:
                batch_id = await _create(api, ctx, spec, part, attempt)
            except QueueFull:
                # the provider's queue is fuller than ours says: this file and the rest wait
                for later in parts[position:]:
                    release(later.index)
                _requeue(ctx, spec, state, part.index)
                break
            created += 1
            state.batch_ids[part.index] = batch_id
            if ctx.progress is not None:
                ctx.progress.waiting(len(part.lines))
            # recorded one by one, so a crash loses at most the batch being created
            ctx.store.set_shard_batches(spec.job_id, spec.shard, state.batch_ids)
    finally:
        if files is None:
            for part in parts:
                part.close()
    return created


def queued_marker(spec: ShardSpec) -> str:
    """What the webhook index holds while no batch of the shard runs: no webhook names it, so
    the wait lasts its whole timeout (the backoff) instead of waking at once."""
    return f"{QUEUED_PREFIX}{spec.job_id}#{spec.shard}"


async def _within_budget(
    parts: list[BatchPart], costs: dict[int, int], budget: Budget, spec: ShardSpec, writer: PartWriter
) -> list[BatchPart]:
    """The files whose worst case the job's budget covers, numbered again in order; the lines
    of the others go to the errors as unsent. Reserved before anything is planned, so a file in
    the plan is always paid for, whenever the queue lets it be created."""
    kept: list[BatchPart] = []
    for part in parts:
        if await budget.take(sum(costs[line] for line in part.lines)):
            part.index = len(kept)
            kept.append(part)
            continue
        for line, custom_id in zip(part.lines, part.custom_ids, strict=True):
            writer.add_invalid(unsent(spec, line, custom_id))
        part.close()
    return kept


def _unsent_since(
    ctx: ShardContext, spec: ShardSpec, row: dict[str, Any], parts: list[BatchPart], writer: PartWriter
) -> None:
    """Lines an earlier attempt's budget left out of the plan but that died before writing them."""
    planned: set[int] = set()
    for index in range(len(row.get("batch_parts") or [])):
        raw = ctx.s3.get_object(Bucket=spec.bucket, Key=part_key(spec, index))["Body"].read()
        planned.update(BatchPart.from_manifest(raw).lines)
    for part in parts:
        for line, custom_id in zip(part.lines, part.custom_ids, strict=True):
            if line not in planned:
                writer.add_invalid(unsent(spec, line, custom_id))


async def submit_batch(
    ctx: ShardContext, spec: ShardSpec, *, client: openai.AsyncOpenAI | None = None
) -> dict[str, Any]:
    """Cut the shard into files and create the batches the queue has room for, or find the ones
    an earlier attempt already created."""
    ctx.store.begin_batch_submit(spec.job_id, spec.shard, time.time())
    row = ctx.store.shard(spec.job_id, spec.shard) or {}
    checkpoint = load_checkpoint(ctx.s3, spec)
    writer = PartWriter(s3=ctx.s3, store=ctx.store, spec=spec, run=checkpoint.runs + 1, progress=ctx.progress)
    settings = ctx.settings
    budget = shard_budget(ctx, spec, batch=True)
    # each line's worst case at the batch price, so a part's batch is created only once it is reserved
    costs: dict[int, int] = {}

    def priced(requests: Iterable[Request]) -> Iterable[Request]:
        for request in requests:
            costs[request.line] = worst_case_nano(request, batch=True)
            yield request

    source = pending(ctx.s3, spec, checkpoint.done, writer.add_invalid)
    parts = split_parts(
        priced(source) if budget is not None else source,
        max_requests=settings.batch_max_requests,
        max_bytes=settings.batch_max_bytes,
        max_tokens=settings.batch_queue_limit,
    )
    created = 0
    try:
        files: dict[int, BatchPart] | None
        if "batch_parts" not in row:
            if budget is not None:
                parts = await _within_budget(parts, costs, budget, spec, writer)
            # the row maps go first: a batch must never exist without a way to read its answers
            for part in parts:
                ctx.s3.put_object(Bucket=spec.bucket, Key=part_key(spec, part.index), Body=part.manifest())
            plan = [{"model": part.model or "", "tokens": part.tokens, "lines": len(part.lines)} for part in parts]
            ctx.store.plan_batch_parts(spec.job_id, spec.shard, plan)
            row = ctx.store.shard(spec.job_id, spec.shard) or {}
            files = {part.index: part for part in parts}
        else:
            # an earlier attempt planned the files: its row maps say which lines each holds
            files = None
            if budget is not None:
                _unsent_since(ctx, spec, row, parts, writer)
        state = ShardBatches.from_row(row)
        if state.batch_ids:
            async with _provider(ctx, client) as api:
                created = await _advance(api, ctx, spec, state, files, QueueTable(ctx.store.table))
            if not any(state.batch_ids):
                ctx.store.await_batch(spec.job_id, spec.shard, queued_marker(spec))
    finally:
        for part in parts:
            part.close()
        if budget is not None:
            budget.close()
    writer.flush(finished=False)
    return {
        "batch_ids": [batch_id for batch_id in state.batch_ids if batch_id],
        "batches_created": created,
        "requests": sum(len(p.lines) for p in parts),
        "wait_seconds": batch_wait_seconds(settings, 0.0),
    }


async def _file_records(api: openai.AsyncOpenAI, file_id: str) -> AsyncIterator[dict[str, Any]]:
    async with api.files.with_streaming_response.content(file_id) as response:
        async for text in response.iter_lines():
            if not text.strip():
                continue
            try:
                record = orjson.loads(text)
            except orjson.JSONDecodeError:
                # a mangled line answers nothing: its row stays unfinished
                continue
            if isinstance(record, dict):
                yield record


def _provider_message(status: int, body: Any) -> str:
    message = code = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message, code = error.get("message"), error.get("code") or error.get("type")
    text = f"HTTP {status}"
    if message:
        text += f": {str(message)[:_EXCERPT]}"
    if code:
        text += f" ({code})"
    return text


def row_outcome(record: dict[str, Any], line: int, latency_s: float) -> Outcome | str | None:
    """One output or error file line as an Outcome; the provider's code for a row it never ran
    (batch_expired, batch_cancelled); None when the line says nothing usable."""
    custom_id = str(record.get("custom_id"))
    response = record.get("response")
    error = record.get("error")
    if isinstance(response, dict) and isinstance(response.get("status_code"), int):
        status = int(response["status_code"])
        body = response.get("body")
        request_id = response.get("request_id")
        request_id = request_id if isinstance(request_id, str) else None
        if 200 <= status < 300:
            return Outcome(line, custom_id, status, body, request_id, latency_s=latency_s)
        return Outcome(
            line,
            custom_id,
            status,
            body,
            request_id,
            error_code=ErrorCode.PROVIDER_ERROR,
            error_message=_provider_message(status, body),
            latency_s=latency_s,
        )
    if isinstance(error, dict):
        code = str(error.get("code") or "")
        if code in UNFINISHED_CODES:
            return code
        message = str(error.get("message") or "the provider reported an error without a message")
        code = code or ErrorCode.PROVIDER_ERROR
        return Outcome(line, custom_id, None, None, None, error_code=code, error_message=message)
    return None


def _ended_at(batch: Any) -> int | None:
    for name in ("completed_at", "failed_at", "expired_at", "cancelled_at", "finalizing_at", "in_progress_at"):
        value = getattr(batch, name, None)
        if value:
            return int(value)
    return None


async def _collect_one(
    api: openai.AsyncOpenAI,
    spec: ShardSpec,
    batch: Any,
    part: BatchPart,
    done: set[int],
    writer: PartWriter,
) -> dict[str, Any]:
    """Write the outcomes of one ended batch; returns what it did, for the shard row and summary."""
    by_custom_id = {cid: line for line, cid in zip(part.lines, part.custom_ids, strict=True) if line not in done}
    pending = set(by_custom_id.values())
    ended = _ended_at(batch)
    # a batch's rows are answered together: its turnaround is every row's latency
    latency_s = float(max(0, ended - batch.created_at)) if ended else 0.0
    written: set[int] = set()
    unfinished: dict[int, str] = {}
    results = errors = 0

    def write(outcome: Outcome) -> None:
        nonlocal results, errors
        writer.add_outcome(outcome)
        written.add(outcome.line)
        results += outcome.ok
        errors += not outcome.ok

    general: list[str] = []
    if batch.status == "failed":
        problems = (batch.errors.data if batch.errors else None) or []
        for problem in problems:
            described = f"{problem.code or 'invalid'}: {problem.message or 'no message'}"
            if problem.param:
                described += f" (param {problem.param})"
            row = problem.line
            if row is None or not 1 <= row <= len(part.lines):
                general.append(described)
                continue
            line = part.lines[row - 1]
            if line in pending and line not in written:
                write(
                    Outcome(
                        line,
                        part.custom_ids[row - 1],
                        None,
                        None,
                        None,
                        error_code=ErrorCode.BATCH_FAILED,
                        error_message=f"batch {batch.id} failed validation on this row: {described}",
                    )
                )
    for file_id in (batch.output_file_id, batch.error_file_id):
        if not file_id:
            continue
        async for record in _file_records(api, file_id):
            line = by_custom_id.get(str(record.get("custom_id")))
            if line is None or line in written:
                continue
            answer = row_outcome(record, line, latency_s)
            if isinstance(answer, Outcome):
                write(answer)
            elif isinstance(answer, str):
                unfinished[line] = answer
    left = [line for line in part.lines if line in pending and line not in written]
    not_run = len(left)
    if spec.on_batch_incomplete == "error":
        reason = f"batch {batch.id} ended {batch.status} before running this row"
        if general:
            reason += "; the provider said: " + "; ".join(general)[:_EXCERPT]
        custom_ids = dict(zip(part.lines, part.custom_ids, strict=True))
        for line in left:
            code = unfinished.get(line, _LEFTOVER_CODE.get(batch.status, ErrorCode.BATCH_FAILED))
            write(Outcome(line, custom_ids[line], None, None, None, error_code=code, error_message=reason))
        left = []
    return {
        "status": batch.status,
        "requests": len(part.lines),
        "results": results,
        "errors": errors,
        "unfinished": not_run,
        # rows left for RunShard to send directly
        "left": len(left),
        # created to ended, in the provider's whole seconds: what a batch row waits instead of a latency
        "turnaround_s": latency_s if ended else None,
    }


async def _delete_files(api: openai.AsyncOpenAI, batches: Iterable[Any]) -> None:
    """The prompts and answers are ours, in S3 now: don't leave copies at the provider.

    Best effort: a file that is already gone, or a refusal, costs nothing but storage there.
    """
    for batch in batches:
        for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
            if file_id:
                with contextlib.suppress(openai.APIError):
                    await api.files.delete(file_id)


async def collect_batch(
    ctx: ShardContext, spec: ShardSpec, *, client: openai.AsyncOpenAI | None = None
) -> dict[str, Any]:
    """Collect every batch that ended and create the files still waiting for room in the queue;
    finish, fall back to direct for leftovers, or wait on."""
    row = ctx.store.shard(spec.job_id, spec.shard) or {}
    state = ShardBatches.from_row(row)
    states: dict[str, dict[str, Any]] = dict(row.get("batch_states") or {})
    checkpoint = load_checkpoint(ctx.s3, spec)
    writer = PartWriter(
        s3=ctx.s3,
        store=ctx.store,
        spec=spec,
        run=checkpoint.runs + 1,
        # a batch's answers are found through its row map and the results file, never by item
        # row: a row per answered line was most of a batch job's DynamoDB writes
        item_rows_for_results=False,
        path="batch",
        progress=ctx.progress,
        cache=fill_for(ctx, spec, run=checkpoint.runs + 1, path="batch"),
    )
    queue = QueueTable(ctx.store.table)
    settings = ctx.settings
    collected: dict[str, dict[str, Any]] = {}
    ended: list[Any] = []
    refused: list[Any] = []
    waiting: list[str] = []
    async with _provider(ctx, client) as api:
        for index, batch_id in enumerate(list(state.batch_ids)):
            if not batch_id or batch_id in states:
                continue
            batch = await api.batches.retrieve(batch_id)
            if batch.status not in TERMINAL:
                waiting.append(batch_id)
                continue
            # the provider's queue let go of these tokens: so does ours
            queue.release(Hold(spec.job_id, spec.shard, index, state.attempt(index)))
            if limit_exceeded(batch):
                # the queue was full: nothing ran, so the file waits and goes again later
                _requeue(ctx, spec, state, index)
                refused.append(batch)
                if ctx.progress is not None:
                    ctx.progress.waiting(-state.lines[index])
                continue
            raw = ctx.s3.get_object(Bucket=spec.bucket, Key=part_key(spec, index))["Body"].read()
            part = BatchPart.from_manifest(raw)
            collected[batch_id] = await _collect_one(api, spec, batch, part, checkpoint.done, writer)
            ended.append(batch)
        await _advance(api, ctx, spec, state, None, queue)
        waiting += [b for b in state.batch_ids if b and b not in states and b not in collected and b not in waiting]
    states.update(collected)
    if ctx.progress is not None:
        ctx.progress.waiting(-sum(int(one.get("left", 0)) for one in collected.values()))
    queued = state.waiting_for_room()
    left = sum(int(one.get("left", 0)) for one in states.values())
    fallback = not waiting and not queued and left > 0
    done = not waiting and not queued and not fallback
    # outcomes first: a batch marked collected must have its rows in the parts
    writer.flush(finished=done)
    for batch_id, collected_state in collected.items():
        ctx.store.mark_batch_collected(spec.job_id, spec.shard, batch_id, collected_state)
    if ended or refused:
        async with _provider(ctx, client) as api:
            await _delete_files(api, [*ended, *refused])
    elapsed = time.time() - float(row.get("batch_submit_at") or time.time())
    wait_seconds = batch_wait_seconds(settings, elapsed)
    outcome = {
        "done": done,
        "fallback": fallback,
        "waiting": len(waiting),
        "collected": len(collected),
        "wait_seconds": wait_seconds,
    }
    if waiting:
        if row.get("provider_id") != waiting[0] or "batch_settled" in row:
            ctx.store.await_batch(spec.job_id, spec.shard, waiting[0])
        return outcome
    if queued:
        # nothing runs to wake the shard: it sleeps until the queue may have room
        outcome["wait_seconds"] = max(wait_seconds, math.ceil(state.retry_at - time.time()))
        if row.get("provider_id") != queued_marker(spec) or "batch_settled" in row:
            ctx.store.await_batch(spec.job_id, spec.shard, queued_marker(spec))
        return outcome
    report = {
        "batches": [{"id": batch_id, **states.get(batch_id, {})} for batch_id in state.batch_ids],
        "on_batch_incomplete": spec.on_batch_incomplete,
        "fallback_lines": left,
        # batches the provider failed with `token_limit_exceeded` and Sluice created again
        "requeued": state.requeued,
        # tokens the batches answered (priced at the batch rate); later direct parts are not in here
        "batch_models": parts_stats(ctx.s3, spec).models,
    }
    ctx.s3.put_object(Bucket=spec.bucket, Key=spec.batch_report_key, Body=orjson.dumps(report))
    if done:
        assemble(ctx.s3, spec)
    return outcome
