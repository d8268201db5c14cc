"""CollectBatch: the outcomes of every batch that ended, written as shard parts, and what the shard
does next: finish, fall back to direct for the rows left, or wait on."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import openai
import orjson

from .batch_advance import ShardBatches, advance, batch_wait_seconds, queued_marker, requeue
from .batch_api import delete_files, provider_api
from .batch_files import BatchPart, part_key
from .batch_queue import Hold, limit_exceeded
from .batch_queue_table import QueueTable
from .cache import fill_for
from .contract import BatchCollected
from .model import ErrorCode, Outcome
from .parts import PartWriter, assemble, load_checkpoint, parts_stats
from .shard import ShardContext, ShardSpec

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
_EXCERPT = 300


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


def _validation_errors(batch: Any, part: BatchPart, pending: set[int]) -> tuple[list[Outcome], list[str]]:
    """A batch that failed validation: an error for each pending row its errors name (once),
    and the errors that name no row of the file."""
    if batch.status != "failed":
        return [], []
    rejected: dict[int, Outcome] = {}
    general: list[str] = []
    for problem in (batch.errors.data if batch.errors else None) or []:
        described = f"{problem.code or 'invalid'}: {problem.message or 'no message'}"
        if problem.param:
            described += f" (param {problem.param})"
        row = problem.line
        if row is None or not 1 <= row <= len(part.lines):
            general.append(described)
            continue
        line = part.lines[row - 1]
        if line in pending and line not in rejected:
            rejected[line] = Outcome(
                line,
                part.custom_ids[row - 1],
                None,
                None,
                None,
                error_code=ErrorCode.BATCH_FAILED,
                error_message=f"batch {batch.id} failed validation on this row: {described}",
            )
    return list(rejected.values()), general


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

    rejected, general = _validation_errors(batch, part, pending)
    for outcome in rejected:
        write(outcome)
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


@dataclass
class _Seen:
    """What one look at the shard's batches found: the states of those collected now (by id), the
    batches that ended (collected) or were refused (to requeue), and the ids still running."""

    collected: dict[str, dict[str, Any]] = field(default_factory=dict)
    ended: list[Any] = field(default_factory=list)
    refused: list[Any] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)


async def _look_at_batches(
    api: openai.AsyncOpenAI,
    ctx: ShardContext,
    spec: ShardSpec,
    state: ShardBatches,
    states: dict[str, dict[str, Any]],
    done: set[int],
    writer: PartWriter,
) -> _Seen:
    """Ask the provider about every batch not collected yet: collect the ended ones, requeue the
    ones its full queue refused, then create the files still waiting for room."""
    queue = QueueTable(ctx.store.table)
    seen = _Seen()
    for index, batch_id in enumerate(list(state.batch_ids)):
        if not batch_id or batch_id in states:
            continue
        batch = await api.batches.retrieve(batch_id)
        if batch.status not in TERMINAL:
            seen.waiting.append(batch_id)
            continue
        # the provider's queue let go of these tokens: so does ours
        queue.release(Hold(spec.job_id, spec.shard, index, state.attempt(index)))
        if limit_exceeded(batch):
            # the queue was full: nothing ran, so the file waits and goes again later
            requeue(ctx, spec, state, index)
            seen.refused.append(batch)
            if ctx.progress is not None:
                ctx.progress.waiting(-state.lines[index])
            continue
        raw = ctx.s3.get_object(Bucket=spec.bucket, Key=part_key(spec, index))["Body"].read()
        part = BatchPart.from_manifest(raw)
        seen.collected[batch_id] = await _collect_one(api, spec, batch, part, done, writer)
        seen.ended.append(batch)
    await advance(api, ctx, spec, state, None, queue)
    seen.waiting += [
        b for b in state.batch_ids if b and b not in states and b not in seen.collected and b not in seen.waiting
    ]
    return seen


async def collect_batch(
    ctx: ShardContext, spec: ShardSpec, *, client: openai.AsyncOpenAI | None = None
) -> BatchCollected:
    """Collect every batch that ended and create the files still waiting for room in the queue;
    finish, fall back to direct for leftovers, or wait on."""
    row = ctx.store.shard(spec.job_id, spec.shard)
    state = ShardBatches.from_row(row)
    states: dict[str, dict[str, Any]] = {k: dict(v) for k, v in ((row and row.batch_states) or {}).items()}
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
    async with provider_api(ctx, client) as api:
        seen = await _look_at_batches(api, ctx, spec, state, states, checkpoint.done, writer)
    collected, ended, refused, waiting = seen.collected, seen.ended, seen.refused, seen.waiting
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
        async with provider_api(ctx, client) as api:
            await delete_files(api, [*ended, *refused])
    elapsed = time.time() - float((row and row.batch_submit_at) or time.time())
    pointed = row.provider_id if row else None
    settled = row is not None and row.batch_settled is not None
    wait_seconds = batch_wait_seconds(ctx.settings, elapsed)
    outcome = BatchCollected(
        done=done, fallback=fallback, waiting=len(waiting), collected=len(collected), wait_seconds=wait_seconds
    )
    if waiting:
        if pointed != waiting[0] or settled:
            ctx.store.await_batch(spec.job_id, spec.shard, waiting[0])
        return outcome
    if queued:
        # nothing runs to wake the shard: it sleeps until the queue may have room
        outcome = replace(outcome, wait_seconds=max(wait_seconds, math.ceil(state.retry_at - time.time())))
        if pointed != queued_marker(spec) or settled:
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
