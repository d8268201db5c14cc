"""A batch shard's files as its row records them, and creating the ones that wait as the provider's
queue makes room (`batch_queue`): SubmitBatch creates the first, CollectBatch the rest."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from sluice.contract import Settings, ShardRow
from sluice.contract.model import Request
from sluice.core.retry import RetryPolicy, backoff_s
from sluice.limits.batch_queue import HOLD_MAX_S, Hold, listed_batches, queue_key
from sluice.limits.batch_queue_table import QueueTable
from sluice.providers.batch import CLOCK_SLACK_S, CREATE_JITTER_FLOOR, BatchApi, BatchLimits, BatchTag, QueueFull
from sluice.runners.batch.files import BatchPart, part_key
from sluice.shard.frame import ShardContext, ShardSpec, poll_wait_seconds, read_shard_lines
from sluice.store.jobs import QUEUED_PREFIX

# A batch's completion window: past it, a shard still waiting is waiting on a queue or a slow
# provider, for days maybe (Bedrock lets a job wait and run for a week; 2,000 jobs at 20 a model
# queue for longer), and its polls stop being capped
BATCH_WINDOW_S = 86_400


def batch_wait_seconds(settings: Settings, elapsed_s: float) -> int:
    """How long AwaitBatch sleeps before polling (batches take minutes to hours).

    Within a batch's window, as every wait does (`poll_wait_seconds`: a tenth of the time waited,
    at most `batch_poll_max_s`): about 330 loops. Past it, a tenth of the time waited with no cap,
    so each loop of AwaitBatch and CollectBatch (13 history events) comes 10% later than the last:
    a longer wait costs loops in proportion to its logarithm (24 more for 10 days, 36 for 30), and
    a shard waits any length within a child execution's 25,000 events. What ends sooner is heard
    sooner: the job's webhook or state-change event wakes the shard; the poll only reconciles."""
    if elapsed_s <= BATCH_WINDOW_S:
        return poll_wait_seconds(settings, elapsed_s)
    return int(elapsed_s / 10)


# Past a batch's window, how many times the time waited a shard waiting for room sleeps between looks
QUEUED_GROWTH = 50


def queued_wait_seconds(settings: Settings, elapsed_s: float) -> int:
    """How long a shard with files waiting for room in the provider's queue sleeps before it looks
    again (`elapsed_s` since its first SubmitBatch).

    Room that other shards free is announced to nobody, so only the look finds it. Within a batch's
    window the shard looks as every wait does (`poll_wait_seconds`: at most `batch_poll_max_s` apart,
    about 330 loops of 13 history events a day); capped like that for good it passed the 25,000
    events of its child execution after about 6.7 days in the queue, and a job of thousands of
    Bedrock jobs at 20 a model queues for longer. Past the window each wait is a fiftieth of the
    time waited: the looks cost loops in proportion to the logarithm of the wait (117 more for 10 days,
    172 for 30), and room freed after 5 days in the queue waits at most 2.4 hours to be taken (a
    tenth, as a submitted batch's polls grow, would leave it 12 hours idle)."""
    if elapsed_s <= BATCH_WINDOW_S:
        return poll_wait_seconds(settings, elapsed_s)
    return int(max(settings.batch_poll_max_s, elapsed_s / QUEUED_GROWTH))


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
    def from_row(cls, row: ShardRow | None) -> ShardBatches:
        plan = list(row.batch_parts or []) if row else []
        batch_ids = list(row.batch_ids or []) if row else []
        batch_ids += [""] * (len(plan) - len(batch_ids))
        return cls(
            batch_ids=batch_ids,
            models=[str(p.get("model") or "") for p in plan],
            tokens=[int(p.get("tokens", 0)) for p in plan],
            lines=[int(p.get("lines", 0)) for p in plan],
            tries={str(k): int(v) for k, v in dict((row and row.batch_tries) or {}).items()},
            retry_at=float((row and row.batch_retry_at) or 0.0),
            requeued=int((row and row.batch_requeued) or 0),
        )

    def attempt(self, index: int) -> int:
        return self.tries.get(str(index), 1)

    def waiting_for_room(self) -> list[int]:
        return [index for index, batch_id in enumerate(self.batch_ids) if not batch_id]


async def _later_parts(
    api: BatchApi, ctx: ShardContext, spec: ShardSpec, state: ShardBatches, indexes: list[int]
) -> list[BatchPart]:
    """The parts created after SubmitBatch, from their row maps: a part whose file an earlier
    attempt staged at the provider goes as its map alone (no file), the others are rebuilt."""
    maps = {
        index: BatchPart.from_manifest(ctx.s3.get_object(Bucket=spec.bucket, Key=part_key(spec, index))["Body"].read())
        for index in indexes
    }
    staged = {
        index
        for index, part in maps.items()
        if await api.staged(BatchTag(spec.job_id, spec.shard, index, state.attempt(index)), part.endpoint)
    }
    rebuilt = _rebuild(api, ctx, spec, {index: part for index, part in maps.items() if index not in staged})
    return [maps[index] if index in staged else rebuilt[index] for index in indexes]


def _rebuild(api: BatchApi, ctx: ShardContext, spec: ShardSpec, maps: dict[int, BatchPart]) -> dict[int, BatchPart]:
    """The files of the parts the maps name, from the shard's input; none read when there are none."""
    if not maps:
        return {}
    owner = {line: index for index, part in maps.items() for line in part.lines}
    rebuilt = {index: BatchPart(index=index, endpoint=part.endpoint, model=part.model) for index, part in maps.items()}
    for item in read_shard_lines(ctx.s3, spec):
        index = owner.get(item.line)
        if index is not None and isinstance(item, Request):
            rebuilt[index].add(item, api.encode(item))
    for index, part in rebuilt.items():
        if part.lines != maps[index].lines:
            raise RuntimeError(f"part {index} of shard {spec.shard} no longer matches its row map")
    return rebuilt


def _requeue_delay_s(settings: Settings, attempt: int) -> float:
    """How long a file the queue refused waits before its next attempt: doubling, up to the poll cap."""
    policy = RetryPolicy(base_delay_s=float(settings.poll_seconds), max_delay_s=float(settings.batch_poll_max_s))
    return backoff_s(attempt, policy, random.random, floor=CREATE_JITTER_FLOOR)


def requeue(ctx: ShardContext, spec: ShardSpec, state: ShardBatches, index: int) -> None:
    state.batch_ids[index] = ""
    attempt = state.attempt(index)
    state.tries[str(index)] = attempt + 1
    state.retry_at = max(state.retry_at, time.time() + _requeue_delay_s(ctx.settings, attempt))
    state.requeued += 1
    ctx.store.requeue_batch(spec.job_id, spec.shard, state.batch_ids, state.tries, state.retry_at)


def queue_measure(limits: BatchLimits, settings: Settings, model: str | None, tokens: int) -> tuple[int, int]:
    """What a part holds in its model's queue, and the queue's limit: its input tokens under the
    token limit, or, where the provider counts jobs (Bedrock), one job under those Sluice keeps at
    once. A queue that counts neither still takes a hold (limit 0): a retry finds its batch by it."""
    if limits.token_queue:
        return tokens, settings.batch_queue_limit(model or None)
    return 1, limits.max_jobs


async def advance(
    api: BatchApi,
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
        tokens, limit = queue_measure(api.limits, settings, model, state.tokens[index])
        got = queue.reserve(name, hold, tokens, limit)
        if not got.granted and model not in reconciled and queue.claim_reconcile(name, got.checked):
            # holds of shards that died are released here, from the provider's own list
            reconciled.add(model)
            listed = await api.listed(since=time.time() - HOLD_MAX_S - CLOCK_SLACK_S)
            if queue.forget(name, listed_batches(listed)):
                got = queue.reserve(name, hold, tokens, limit)
        if not got.granted:
            full.add(model)
            continue
        if got.held_since is not None:
            found = await api.find(spec.job_id, spec.shard, since=got.held_since - CLOCK_SLACK_S)
            batch_id = found.get(BatchTag(spec.job_id, spec.shard, index, state.attempt(index)))
            if batch_id is not None:
                state.batch_ids[index] = batch_id
                ctx.store.set_shard_batches(spec.job_id, spec.shard, state.batch_ids)
                continue
        granted.append(index)
    if not granted:
        return 0
    parts = await _later_parts(api, ctx, spec, state, granted) if files is None else [files[i] for i in granted]

    def release(index: int) -> None:
        queue.release(Hold(spec.job_id, spec.shard, index, state.attempt(index)))

    created = 0
    try:
        for position, part in enumerate(parts):
            tag = BatchTag(spec.job_id, spec.shard, part.index, state.attempt(part.index))
            try:
                batch_id = await api.submit(part.upload(), tag)
            except QueueFull:
                # the provider's queue is fuller than ours says: this file and the rest wait
                for later in parts[position:]:
                    release(later.index)
                requeue(ctx, spec, state, part.index)
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
