"""Batch mode: a shard's rows go through the provider's Batch API.

SubmitBatch cuts the rows that have no terminal outcome yet into files — one endpoint
and one model per file, within the provider's request and byte limits and its model's Batch
queue limit — and creates a batch per file for as many files as the queue has room for
(`batch_queue`: tokens are reserved in the table first, since every shard of every job on the
key shares the queue). CollectBatch streams back the answered rows of the batches that ended
and writes their outcomes as shard parts, exactly like a direct run, so checkpoints, assembly
and merge work unchanged; then it creates the files still waiting, as the ended batches made
room. A batch the provider failed because its queue was full (OpenAI's `token_limit_exceeded`)
answered nothing: its file goes back to waiting and is created again after a backoff, under a
new attempt number.
Rows a batch did not finish get no outcome when the job's policy is `direct` (RunShard then
sends them, as it sends every line missing from the parts), or an error line when it is `error`.

Which input line a batch row answers is kept in S3 per batch file (`batch-<part>.json`), written
for every file before any batch exists: providers return rows in any order, validation errors
name rows by their line in the uploaded file, and a file created later is rebuilt from it.

SubmitBatch is here; the rest of the mode: the files and their row maps (`batch_files`), creating
files as the queue makes room (`batch_advance`), and CollectBatch (`batch_collect`, whose
`collect_batch` this module exports). The provider's Batch API is the shard context's
(`providers.batch.BatchApi`): its rows, limits and calls are the only provider this mode knows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sluice.contract import BatchSubmitted, CollectedBatch, Mode, ShardRow, causes
from sluice.contract.model import Request
from sluice.limits.batch_queue_table import QueueTable
from sluice.limits.budget import Budget, worst_case_nano
from sluice.providers import family
from sluice.providers.batch import BatchApi
from sluice.runners.batch.advance import ShardBatches, advance, batch_wait_seconds, queued_marker
from sluice.runners.batch.collect import collect_batch as collect_batch
from sluice.runners.batch.cutover import until_cutover
from sluice.runners.batch.files import BatchPart, part_key, split_parts
from sluice.shard.frame import ShardContext, ShardSpec
from sluice.shard.run import ShardRun

# the shard row's name, among its batches' states, for the lines of files too small for a batch:
# they count as left over from the start, so CollectBatch hands them to RunShard
BELOW_MINIMUM = "below-minimum"


def _at_least(parts: list[BatchPart], min_records: int) -> tuple[list[BatchPart], int]:
    """The files the provider takes (at least `min_records` rows, numbered again in order), and how
    many lines the others held: those go direct, as no batch would be accepted for them."""
    kept: list[BatchPart] = []
    below = 0
    for part in parts:
        if len(part.lines) >= min_records:
            part.index = len(kept)
            kept.append(part)
            continue
        below += len(part.lines)
        part.close()
    return kept, below


async def _within_budget(
    parts: list[BatchPart], costs: dict[int, int], budget: Budget, run: ShardRun
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
            run.writer.add_invalid(run.unsent(line, custom_id))
        part.close()
    return kept


def _unsent_since(run: ShardRun, row: ShardRow, parts: list[BatchPart]) -> None:
    """Lines an earlier attempt's budget left out of the plan but that died before writing them."""
    ctx, spec = run.ctx, run.spec
    planned: set[int] = set()
    for index in range(len(row.batch_parts or ())):
        raw = ctx.s3.get_object(Bucket=spec.bucket, Key=part_key(spec, index))["Body"].read()
        planned.update(BatchPart.from_manifest(raw).lines)
    for part in parts:
        for line, custom_id in zip(part.lines, part.custom_ids, strict=True):
            if line not in planned:
                run.writer.add_invalid(run.unsent(line, custom_id))


async def submit_batch(ctx: ShardContext, spec: ShardSpec) -> BatchSubmitted:
    """Cut the shard into files and create the batches the queue has room for, or find the ones
    an earlier attempt already created."""
    ctx.store.begin_batch_submit(spec.job_id, spec.shard, time.time())
    async with ctx.batches() as api:
        return await _submit(api, ctx, spec)


@causes.under(causes.BATCH_SUBMIT)
async def _submit(api: BatchApi, ctx: ShardContext, spec: ShardSpec) -> BatchSubmitted:
    row = ctx.store.shard(spec.job_id, spec.shard)
    # a line sent direct instead (no batch takes it) is written as direct's; a batch fills no cache
    run = ShardRun(ctx, spec, path=Mode.DIRECT, fills_cache=False, batch=True)
    settings = ctx.settings
    budget = run.budget
    # each line's worst case at the batch price, so a part's batch is created only once it is reserved
    costs: dict[int, int] = {}

    def priced(requests: Iterable[Request]) -> Iterable[Request]:
        for request in requests:
            costs[request.line] = worst_case_nano(request, family(spec.provider), batch=True)
            yield request

    source = run.pending()
    unbatchable: list[int] = []
    parts = split_parts(
        priced(source) if budget is not None else source,
        max_requests=api.limits.max_records,
        max_bytes=api.limits.max_bytes,
        encode=api.encode,
        max_tokens=settings.batch_queue_limit if api.limits.token_queue else None,
        unbatchable=unbatchable,
    )
    parts, below = _at_least(parts, api.limits.min_records)
    # lines no batch would take go direct with the files below the minimum
    below += len(unbatchable)
    created = 0
    try:
        files: dict[int, BatchPart] | None
        if row is None or row.batch_parts is None:
            if budget is not None:
                parts = await _within_budget(parts, costs, budget, run)
            # the row maps go first: a batch must never exist without a way to read its answers
            for part in parts:
                ctx.s3.put_object(Bucket=spec.bucket, Key=part_key(spec, part.index), Body=part.manifest())
            plan = [{"model": part.model or "", "tokens": part.tokens, "lines": len(part.lines)} for part in parts]
            ctx.store.plan_batch_parts(spec.job_id, spec.shard, plan)
            row = ctx.store.shard(spec.job_id, spec.shard)
            files = {part.index: part for part in parts}
        else:
            # an earlier attempt planned the files: its row maps say which lines each holds
            files = None
            if budget is not None:
                _unsent_since(run, row, parts)
        if below:
            # marked again by every attempt, as one may have died between the plan and this
            direct = CollectedBatch(BELOW_MINIMUM, requests=below, results=0, errors=0, unfinished=0, left=below)
            ctx.store.mark_batch_collected(spec.job_id, spec.shard, BELOW_MINIMUM, direct.as_dict())
        state = ShardBatches.from_row(row)
        if state.batch_ids:
            created = await advance(api, ctx, spec, state, files, QueueTable(ctx.store.table))
            if not any(state.batch_ids):
                ctx.store.await_batch(spec.job_id, spec.shard, queued_marker(spec))
    finally:
        for part in parts:
            part.close()
        if budget is not None:
            budget.close()
    run.writer.flush(finished=False)
    return BatchSubmitted(
        batch_ids=[batch_id for batch_id in state.batch_ids if batch_id],
        batches_created=created,
        requests=sum(len(p.lines) for p in parts),
        # no batch to wait for when every file was too small for one: straight on to RunShard
        wait_seconds=(
            until_cutover(
                batch_wait_seconds(settings, 0.0),
                spec.cutover_at,
                time.time(),
                cancel_s=spec.batch_cancel_s or settings.batch_cancel_s,
                floor_s=settings.poll_seconds,
            )
            if parts
            else 0
        ),
    )
