"""Batch mode: a shard's rows go through the provider's Files and Batch APIs.

SubmitBatch uploads the rows that have no terminal outcome yet as JSONL files — one endpoint
and one model per file, within the provider's request and byte limits — and creates one batch
per file. CollectBatch streams back the output and error files of the batches that ended and
writes their outcomes as shard parts, exactly like a direct run, so checkpoints, assembly and
merge work unchanged. Rows a batch did not finish get no outcome when the job's policy is
`direct` (RunShard then sends them, as it sends every line missing from the parts), or an
error line when it is `error`.

Which input line a batch row answers is kept in S3 per batch file (`batch-<part>.json`), written
before the batch exists: providers return rows in any order, and validation errors name rows
by their line in the uploaded file.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import IO, Any, Literal, cast

import openai
import orjson

from .cache import fill_for
from .contract import Settings
from .model import ErrorCode, Outcome, Request
from .parts import PartWriter, assemble, load_checkpoint, parts_stats
from .retry import RetryPolicy, backoff_s
from .shard import ShardContext, ShardSpec, pending, poll_wait_seconds

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
    file: IO[bytes] | None = None

    def add(self, request: Request, row: bytes) -> None:
        if self.file is None:
            # open across calls and closed by close(): the submit holds every part until it uploads it
            self.file = cast(IO[bytes], tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))  # noqa: SIM115
        self.file.write(row)
        self.lines.append(request.line)
        self.custom_ids.append(request.custom_id)
        self.size += len(row)

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


def split_parts(requests: Iterable[Request], *, max_requests: int, max_bytes: int) -> list[BatchPart]:
    """Cut the requests into batch files: one per (endpoint, model), a new one at either limit.

    Deterministic for the same requests, so a retried submit numbers its parts the same way
    and recognises the batches it created before.
    """
    parts: list[BatchPart] = []
    current: dict[tuple[str, str | None], BatchPart] = {}
    for request in requests:
        row = batch_row(request)
        group = (request.path, request_model(request))
        part = current.get(group)
        full = part is not None and (
            len(part.lines) >= max_requests or (part.lines and part.size + len(row) > max_bytes)
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


async def _created_batches(api: openai.AsyncOpenAI, spec: ShardSpec, since: float) -> dict[int, str]:
    """Batches an earlier attempt of this submit created, by part, from their metadata.

    Listed newest first, so the scan stops at the first batch older than that attempt.
    """
    found: dict[int, str] = {}
    async for batch in api.batches.list(limit=100):
        if batch.created_at < since:
            break
        metadata = batch.metadata or {}
        part = metadata.get("part", "")
        if metadata.get("job") == spec.job_id and metadata.get("shard") == str(spec.shard) and part.isdigit():
            # a second copy should not exist; if one does, the older one is the one recorded
            found[int(part)] = batch.id
    return found


async def _create(api: openai.AsyncOpenAI, ctx: ShardContext, spec: ShardSpec, part: BatchPart) -> str:
    # the row map goes first: a batch must never exist without a way to read its answers
    ctx.s3.put_object(Bucket=spec.bucket, Key=part_key(spec, part.index), Body=part.manifest())
    assert part.file is not None
    part.file.seek(0)
    name = f"sluice-{spec.job_id}-{spec.shard:05d}-{part.index:03d}.jsonl"
    uploaded = await api.files.create(
        file=(name, part.file, "application/jsonl"), purpose="batch", timeout=UPLOAD_TIMEOUT_S
    )
    started = time.time()
    once = api.with_options(max_retries=0)
    attempt = 0
    while True:
        attempt += 1
        try:
            batch = await once.batches.create(
                input_file_id=uploaded.id,
                endpoint=cast(Any, part.endpoint),
                completion_window=COMPLETION_WINDOW,
                metadata={"job": spec.job_id, "shard": str(spec.shard), "part": str(part.index)},
            )
            return batch.id
        except _AMBIGUOUS:
            found = await _created_batches(api, spec, since=started - CLOCK_SLACK_S)
            if part.index in found:
                return found[part.index]
            if attempt >= CREATE_POLICY.max_attempts:
                raise
            await asyncio.sleep(backoff_s(attempt, CREATE_POLICY, random.random, floor=CREATE_JITTER_FLOOR))


async def submit_batch(
    ctx: ShardContext, spec: ShardSpec, *, client: openai.AsyncOpenAI | None = None
) -> dict[str, Any]:
    """Create the shard's batches, or find the ones an earlier attempt already created."""
    earlier = ctx.store.begin_batch_submit(spec.job_id, spec.shard, time.time())
    recorded: list[str] = list((ctx.store.shard(spec.job_id, spec.shard) or {}).get("batch_ids") or [])
    checkpoint = load_checkpoint(ctx.s3, spec)
    writer = PartWriter(s3=ctx.s3, store=ctx.store, spec=spec, run=checkpoint.runs + 1, progress=ctx.progress)
    settings = ctx.settings
    parts = split_parts(
        pending(ctx.s3, spec, checkpoint.done, writer.add_invalid),
        max_requests=settings.batch_max_requests,
        max_bytes=settings.batch_max_bytes,
    )
    batch_ids: list[str] = []
    created = 0
    try:
        async with _provider(ctx, client) as api:
            found: dict[int, str] = {}
            if earlier is not None and len(recorded) < len(parts):
                # the earlier attempt may have died between creating a batch and recording it
                found = await _created_batches(api, spec, since=earlier - CLOCK_SLACK_S)
            for part in parts:
                batch_id = recorded[part.index] if part.index < len(recorded) else found.get(part.index)
                if batch_id is None:
                    batch_id = await _create(api, ctx, spec, part)
                    created += 1
                batch_ids.append(batch_id)
                if ctx.progress is not None:
                    ctx.progress.waiting(len(part.lines))
                if batch_ids != recorded[: len(batch_ids)]:
                    # recorded one by one, so a crash loses at most the batch being created
                    ctx.store.set_shard_batches(spec.job_id, spec.shard, batch_ids)
    finally:
        for part in parts:
            part.close()
    writer.flush(finished=False)
    return {
        "batch_ids": batch_ids,
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
    """Collect every batch that ended; finish, fall back to direct for leftovers, or wait on."""
    row = ctx.store.shard(spec.job_id, spec.shard) or {}
    batch_ids: list[str] = list(row.get("batch_ids") or [])
    states: dict[str, dict[str, Any]] = dict(row.get("batch_states") or {})
    checkpoint = load_checkpoint(ctx.s3, spec)
    writer = PartWriter(
        s3=ctx.s3,
        store=ctx.store,
        spec=spec,
        run=checkpoint.runs + 1,
        path="batch",
        progress=ctx.progress,
        cache=fill_for(ctx, spec, run=checkpoint.runs + 1, path="batch"),
    )
    collected: dict[str, dict[str, Any]] = {}
    ended: list[Any] = []
    waiting: list[str] = []
    async with _provider(ctx, client) as api:
        for index, batch_id in enumerate(batch_ids):
            if batch_id in states:
                continue
            batch = await api.batches.retrieve(batch_id)
            if batch.status not in TERMINAL:
                waiting.append(batch_id)
                continue
            raw = ctx.s3.get_object(Bucket=spec.bucket, Key=part_key(spec, index))["Body"].read()
            part = BatchPart.from_manifest(raw)
            collected[batch_id] = await _collect_one(api, spec, batch, part, checkpoint.done, writer)
            ended.append(batch)
    states.update(collected)
    if ctx.progress is not None:
        ctx.progress.waiting(-sum(int(state.get("left", 0)) for state in collected.values()))
    left = sum(int(state.get("left", 0)) for state in states.values())
    fallback = not waiting and left > 0
    done = not waiting and not fallback
    # outcomes first: a batch marked collected must have its rows in the parts
    writer.flush(finished=done)
    for batch_id, state in collected.items():
        ctx.store.mark_batch_collected(spec.job_id, spec.shard, batch_id, state)
    if ended:
        async with _provider(ctx, client) as api:
            await _delete_files(api, ended)
    elapsed = time.time() - float(row.get("batch_submit_at") or time.time())
    outcome = {
        "done": done,
        "fallback": fallback,
        "waiting": len(waiting),
        "collected": len(collected),
        "wait_seconds": batch_wait_seconds(ctx.settings, elapsed),
    }
    if waiting:
        if row.get("provider_id") != waiting[0] or "batch_settled" in row:
            ctx.store.await_batch(spec.job_id, spec.shard, waiting[0])
        return outcome
    report = {
        "batches": [{"id": batch_id, **states.get(batch_id, {})} for batch_id in batch_ids],
        "on_batch_incomplete": spec.on_batch_incomplete,
        "fallback_lines": left,
        # tokens the batches answered (priced at the batch rate); later direct parts are not in here
        "batch_models": parts_stats(ctx.s3, spec).models,
    }
    ctx.s3.put_object(Bucket=spec.bucket, Key=spec.batch_report_key, Body=orjson.dumps(report))
    if done:
        assemble(ctx.s3, spec)
    return outcome
