"""CollectBatch: the outcomes of every batch that ended, written as shard parts, and what the shard
does next: finish, fall back to direct for the rows left, or wait on."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import orjson

from sluice.contract import BatchCollected, CollectedBatch, Mode, causes
from sluice.contract.model import ErrorCode, Outcome, Request
from sluice.limits.batch_queue import Hold
from sluice.limits.batch_queue_table import QueueTable
from sluice.providers.batch import BatchApi, BatchRow, BatchState, BatchStatus
from sluice.runners.batch.advance import (
    ShardBatches,
    advance,
    batch_wait_seconds,
    queued_marker,
    queued_wait_seconds,
    requeue,
)
from sluice.runners.batch.cutover import cancel_late, past_cutover, until_cutover
from sluice.runners.batch.files import BatchPart, part_key
from sluice.send.output_check import OutputCheck
from sluice.shard.assembly import assemble
from sluice.shard.frame import ShardContext, ShardSpec, pending
from sluice.shard.parts import PartWriter, parts_stats
from sluice.shard.run import ShardRun

# the code for a row left unfinished, by how its batch ended
_LEFTOVER_CODE = {
    BatchState.EXPIRED: ErrorCode.BATCH_EXPIRED,
    BatchState.CANCELLED: ErrorCode.BATCH_CANCELLED,
    BatchState.FAILED: ErrorCode.BATCH_FAILED,
    BatchState.COMPLETED: ErrorCode.BATCH_FAILED,
}
_EXCERPT = 300


def row_outcome(row: BatchRow, line: int, custom_id: str, latency_s: float) -> Outcome | str:
    """A batch row's answer as the Outcome of input line `line`; the code of a row the provider never
    ran (batch_expired, batch_cancelled), which follows the job's policy."""
    if row.unfinished:
        return row.error_code or ErrorCode.BATCH_FAILED
    if row.status_code is not None:
        return Outcome(
            line,
            custom_id,
            row.status_code,
            row.body,
            row.request_id,
            error_code=row.error_code,
            error_message=row.error_message,
            latency_s=latency_s,
        )
    return Outcome(line, custom_id, None, None, None, error_code=row.error_code, error_message=row.error_message)


def _validation_errors(batch: BatchStatus, part: BatchPart, pending: set[int]) -> tuple[list[Outcome], list[str]]:
    """A batch that failed validation: an error for each pending row its errors name (once),
    and the errors that name no row of the file."""
    if batch.state != BatchState.FAILED:
        return [], []
    rejected: dict[int, Outcome] = {}
    general: list[str] = []
    for problem in batch.problems:
        described = f"{problem.code or 'invalid'}: {problem.message or 'no message'}"
        if problem.param:
            described += f" (param {problem.param})"
        row = problem.row
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
    api: BatchApi,
    spec: ShardSpec,
    batch: BatchStatus,
    part: BatchPart,
    done: set[int],
    writer: PartWriter,
    checked: _Checked | None = None,
) -> CollectedBatch:
    """Write the outcomes of one ended batch; returns what it did, for the shard row and summary.
    With `checked` (a validating job), an answer that fails the job's checks is left for the
    shard's direct pass, which sends it again, or is an `invalid_output` error when the job sends
    an answer once or reports what batches leave."""
    custom_ids = dict(zip(part.lines, part.custom_ids, strict=True))
    by_ref = {api.row_ref(line, cid): line for line, cid in custom_ids.items() if line not in done}
    pending = set(by_ref.values())
    ended = batch.ended_at
    # a batch's rows are answered together: its turnaround is every row's latency
    latency_s = max(0.0, ended - batch.created_at) if ended else 0.0
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
    async for row in api.rows(batch):
        line = by_ref.get(row.ref)
        if line is None or line in written:
            continue
        answer = row_outcome(row, line, custom_ids[line], latency_s)
        if isinstance(answer, Outcome):
            if checked is not None and not checked.passes(answer, writer, final=spec.on_batch_incomplete == "error"):
                continue
            write(answer)
        else:
            unfinished[line] = answer
    left = [line for line in part.lines if line in pending and line not in written]
    not_run = len(left)
    if spec.on_batch_incomplete == "error":
        reason = f"batch {batch.id} ended {batch.state} before running this row"
        if general:
            reason += "; the provider said: " + "; ".join(general)[:_EXCERPT]
        for line in left:
            code = unfinished.get(line, _LEFTOVER_CODE.get(batch.state, ErrorCode.BATCH_FAILED))
            write(Outcome(line, custom_ids[line], None, None, None, error_code=code, error_message=reason))
        left = []
    return CollectedBatch(
        status=batch.state,
        requests=len(part.lines),
        results=results,
        errors=errors,
        unfinished=not_run,
        left=len(left),
        turnaround_s=latency_s if ended else None,
        model=part.model,
        measured_s=batch.measured_turnaround_s,
        censored_s=batch.censored_turnaround_s,
    )


class _Checked:
    """A validating batch shard's checks, with the requests its answers are judged against (the
    shard's lines still without an outcome, read once a look)."""

    def __init__(self, check: OutputCheck, requests: Mapping[int, Request]) -> None:
        self.check = check
        self.requests = requests

    def passes(self, answer: Outcome, writer: PartWriter, *, final: bool) -> bool:
        """Whether to write `answer` now: it passed, or it is final (invalid_output); one to send
        again is noted as turned down and left for the direct pass."""
        request = self.requests.get(answer.line)
        if request is None:
            return True
        failed: list[str] = []
        if self.check.judge(request, answer, failed) is None:
            return True
        if final:
            self.check.give_up(answer, failed, "the job reports what its batches leave (on-batch-incomplete: error)")
            return True
        writer.add_turned_down(answer.line, failed[-1])
        return False


@dataclass
class _Seen:
    """What one look at the shard's batches found: the states of those collected now (by id), the
    batches that ended (collected) or were refused (to requeue), and the ids still running."""

    collected: dict[str, CollectedBatch] = field(default_factory=dict)
    ended: list[BatchStatus] = field(default_factory=list)
    refused: list[BatchStatus] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)


async def _look_at_batches(
    api: BatchApi,
    ctx: ShardContext,
    spec: ShardSpec,
    state: ShardBatches,
    states: Mapping[str, CollectedBatch],
    done: set[int],
    writer: PartWriter,
) -> _Seen:
    """Ask the provider about every batch not collected yet: collect the ended ones, requeue the
    ones its full queue refused, then create the files still waiting for room."""
    queue = QueueTable(ctx.store.table)
    seen = _Seen()
    check = OutputCheck.for_spec(spec)
    checked: _Checked | None = None
    for index, batch_id in enumerate(list(state.batch_ids)):
        if not batch_id or batch_id in states:
            continue
        batch = await api.status(batch_id)
        if not batch.ended:
            # a deadline job's batch not ended by its cutover stops, and what it left goes direct
            await cancel_late(api, batch, cutover_at=spec.cutover_at, now=time.time())
            seen.waiting.append(batch_id)
            continue
        with causes.because(causes.BATCH_COLLECT):
            # the provider's queue let go of these tokens: so does ours
            queue.release(Hold(spec.job_id, spec.shard, index, state.attempt(index)))
            if batch.queue_full:
                # the queue was full: nothing ran, so the file waits and goes again later
                requeue(ctx, spec, state, index)
                seen.refused.append(batch)
                if ctx.progress is not None:
                    ctx.progress.waiting(-state.lines[index])
                continue
            raw = ctx.s3.get_object(Bucket=spec.bucket, Key=part_key(spec, index))["Body"].read()
            part = BatchPart.from_manifest(raw)
            if check is not None and checked is None:
                checked = _Checked(check, {r.line: r for r in pending(ctx.s3, spec, done, lambda _: None)})
            seen.collected[batch_id] = await _collect_one(api, spec, batch, part, done, writer, checked)
            seen.ended.append(batch)
    if not past_cutover(spec.cutover_at, time.time()) and state.waiting_for_room():
        with causes.because(causes.REQUEUED):
            await advance(api, ctx, spec, state, None, queue)
    seen.waiting += [
        b for b in state.batch_ids if b and b not in states and b not in seen.collected and b not in seen.waiting
    ]
    return seen


async def collect_batch(ctx: ShardContext, spec: ShardSpec) -> BatchCollected:
    """A waiting shard's poll, on the workflow's schedule (never closer than `poll_seconds`)."""
    with causes.because(causes.POLL, period_s=float(ctx.settings.poll_seconds)):
        return await _collect_batch(ctx, spec)


async def _collect_batch(ctx: ShardContext, spec: ShardSpec) -> BatchCollected:
    """Collect every batch that ended and create the files still waiting for room in the queue;
    finish, fall back to direct for leftovers, or wait on."""
    row = ctx.store.shard(spec.job_id, spec.shard)
    state = ShardBatches.from_row(row)
    states = {k: CollectedBatch.from_dict(v) for k, v in ((row and row.batch_states) or {}).items()}
    # a batch's answers are found through its row map and the results file, never by item row:
    # a row per answered line was most of a batch job's DynamoDB writes
    run = ShardRun(ctx, spec, path=Mode.BATCH, item_rows_for_results=False)
    checkpoint, writer = run.checkpoint, run.writer
    async with ctx.batches() as api:
        seen = await _look_at_batches(api, ctx, spec, state, states, checkpoint.done, writer)
    collected, ended, refused, waiting = seen.collected, seen.ended, seen.refused, seen.waiting
    states.update(collected)
    if ctx.progress is not None:
        ctx.progress.waiting(-sum(one.left for one in collected.values()))
    queued = state.waiting_for_room()
    left = sum(one.left for one in states.values())
    if queued and past_cutover(spec.cutover_at, time.time()):
        # files still waiting for room at a deadline's cutover are never created: their lines go direct
        left += sum(state.lines[index] for index in queued)
        queued = []
    fallback = not waiting and not queued and left > 0
    done = not waiting and not queued and not fallback
    # outcomes first: a batch marked collected must have its rows in the parts
    writer.flush(finished=done)
    for batch_id, collected_state in collected.items():
        with causes.because(causes.BATCH_COLLECT, count=0):
            ctx.store.mark_batch_collected(spec.job_id, spec.shard, batch_id, collected_state.as_dict())
    if ended or refused:
        async with ctx.batches() as api:
            await api.clean_up([*ended, *refused])
    elapsed = time.time() - float((row and row.batch_submit_at) or time.time())
    pointed = row.provider_id if row else None
    settled = row is not None and row.batch_settled is not None
    wait_seconds = until_cutover(
        batch_wait_seconds(ctx.settings, elapsed),
        spec.cutover_at,
        time.time(),
        cancel_s=spec.batch_cancel_s or ctx.settings.batch_cancel_s,
        floor_s=ctx.settings.poll_seconds,
    )
    outcome = BatchCollected(
        done=done, fallback=fallback, waiting=len(waiting), collected=len(collected), wait_seconds=wait_seconds
    )
    if waiting:
        if pointed != waiting[0] or settled:
            ctx.store.await_batch(spec.job_id, spec.shard, waiting[0])
        return outcome
    if queued:
        # nothing runs to wake the shard: it sleeps until the queue may have room, for room that
        # others free is not announced
        room_s = max(queued_wait_seconds(ctx.settings, elapsed), math.ceil(state.retry_at - time.time()))
        outcome = replace(outcome, wait_seconds=room_s)
        if pointed != queued_marker(spec) or settled:
            ctx.store.await_batch(spec.job_id, spec.shard, queued_marker(spec))
        return outcome
    report = {
        "batches": [
            {"id": batch_id, **(states[batch_id].as_dict() if batch_id in states else {})}
            for batch_id in state.batch_ids
        ],
        "on_batch_incomplete": spec.on_batch_incomplete,
        "fallback_lines": left,
        # batches the provider failed for a full queue (`token_limit_exceeded`) and Sluice created again
        "requeued": state.requeued,
        # tokens the batches answered (priced at the batch rate); later direct parts are not in here
        "batch_models": parts_stats(ctx.s3, spec).models,
    }
    ctx.s3.put_object(Bucket=spec.bucket, Key=spec.batch_report_key, Body=orjson.dumps(report))
    if done:
        assemble(ctx.s3, spec)
    return outcome
