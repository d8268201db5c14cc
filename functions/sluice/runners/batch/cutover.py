"""A deadline job's batch shard at its cutover (`sluice.plan.deadline`): a batch that has not ended by
then is cancelled, so that what it answered is kept and the rest is sent directly in time.

The provider hands back every answer a cancelled (or expired) batch gave, and bills only those;
CollectBatch writes them to the shard's parts when the batch has ended, and RunShard then sends
just the lines the parts do not hold: a line the batch answered is never sent again. The cancel is
one call a late batch, made by the poll that finds the cutover passed: nothing per line.

Past the cutover the rate is handed over (`handed_over`): the direct shards have ended by then, so
each batch shard sends what its batch left at its part of the job's whole rate (`cutover_share`, its
lines over all batch lines), not the equal share of the shards running it had before. The parts add
up to the job's rate, so the job never passes its `sluice-rpm`, and every late shard, however many
are late, has sent its lines by the time the plan kept for them all."""

from __future__ import annotations

import logging
import math
from dataclasses import replace

from sluice.contract import Mode, ShardSpec
from sluice.limits.flow import MAX_SHARD_CONNECTIONS
from sluice.providers.batch import BatchApi, BatchState, BatchStatus, CancelRefused

logger = logging.getLogger(__name__)


def past_cutover(cutover_at: float | None, now: float) -> bool:
    return cutover_at is not None and now >= cutover_at


def handed_over(spec: ShardSpec, now: float) -> ShardSpec:
    """The shard as its direct pass sends: a deadline job's batch shard past its cutover takes its
    part of the job's whole rate limits and concurrency; any other shard is as Plan cut it."""
    share = spec.cutover_share
    if spec.mode != Mode.BATCH or not share or not past_cutover(spec.cutover_at, now):
        return spec
    # the job's concurrency as Plan shared it among the shards running
    concurrency = math.ceil(spec.concurrency * spec.running * share)
    return replace(
        spec,
        rpm=spec.job_rpm * share,
        tpm=spec.job_tpm * share,
        concurrency=max(1, min(MAX_SHARD_CONNECTIONS, concurrency)),
    )


async def cancel_late(api: BatchApi, batch: BatchStatus, *, cutover_at: float | None, now: float) -> bool:
    """Cancel `batch` (still running) when the shard's cutover has passed; True when it was asked to
    stop, now or before (it ends as `cancelled` and is collected as any ended batch)."""
    if not past_cutover(cutover_at, now):
        return False
    if batch.state == BatchState.CANCELLING:
        return True
    try:
        await api.cancel(batch.id)
    except CancelRefused as exc:
        # it ended meanwhile, or the provider says no: the next look collects whatever it is
        logger.warning("batch %s: cancel at the deadline's cutover refused: %s", batch.id, exc)
        return False
    logger.info("batch %s: not ended by the cutover; cancelled, its answers kept, the rest sent directly", batch.id)
    return True


def until_cutover(wait_s: int, cutover_at: float | None, now: float, *, cancel_s: float, floor_s: int) -> int:
    """A batch shard's wait, cut short to wake at its cutover; past it, short enough to hear the
    cancelled batch end within a tenth of the time a cancel is given (`cancel_s`), not a wait grown
    with the time waited, which would eat the margin the plan kept for sending the rest."""
    if cutover_at is None:
        return wait_s
    if now >= cutover_at:
        return max(1, min(wait_s, max(floor_s, math.ceil(cancel_s / 10))))
    return max(1, min(wait_s, math.ceil(cutover_at - now)))
