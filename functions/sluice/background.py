"""Background mode: each line becomes a background response, submitted once and polled to its end.

SubmitShard creates the responses and remembers their ids in item rows, CollectShard polls them
until every one has settled (or webhooks settle them first). The requests and what a poll's body
says are the provider's (`providers.background.BackgroundApi`, the shard context's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from .cache import fill_for
from .contract import Collected, Mode, Submitted
from .model import ErrorCode, Outcome, Request
from .parts import PartWriter, assemble, load_checkpoint
from .providers.background import BackgroundApi, Settled
from .shard import (
    ShardContext,
    ShardSpec,
    left_to_send,
    opening_delay_s,
    pending,
    poll_wait_seconds,
    send_requests,
    shard_budget,
    write_unsent,
)
from .store import ItemState
from .sweep import send_and_hand_back

# A background response still running after this long is reported expired: every wait loop
# adds history events to the shard's execution, which AWS caps at 25,000.
BACKGROUND_MAX_WAIT_S = 24 * 3600.0


async def submit_background(ctx: ShardContext, spec: ShardSpec) -> Submitted:
    """Create a background response per pending line and remember its id in the item row.

    Lines for an endpoint with no background form (chat completions, embeddings, completions)
    are sent directly instead: their answer is final the moment it arrives.
    """
    checkpoint = load_checkpoint(ctx.s3, spec)
    skip = set(checkpoint.done)
    skip.update(i.line for i in ctx.store.items(spec.job_id, spec.shard) if i.provider_id)
    fill = fill_for(ctx, spec, run=checkpoint.runs + 1, path=Mode.BACKGROUND)
    writer = PartWriter(
        s3=ctx.s3,
        store=ctx.store,
        spec=spec,
        run=checkpoint.runs + 1,
        path=Mode.BACKGROUND,
        progress=ctx.progress,
        cache=fill,
    )
    # lines in flight that were sent directly; a set of the in-flight ones only
    direct: set[int] = set()
    # every line this run ended or handed to the provider, to know which the budget kept back
    seen: set[int] = set()
    api = ctx.background

    def prepare(request: Request) -> Request:
        if api.runs_in_background(request):
            return api.submit_request(request)
        direct.add(request.line)
        return request

    sink = _submit_sink(api, writer, direct, seen)

    source = pending(ctx.s3, spec, skip, writer.add_invalid)
    # keyed as the line asks, before `background: true` is added: a direct run of it shares the answer
    requests = (prepare(r) for r in (fill.track(source) if fill is not None else source))
    if checkpoint.runs == 0:
        await asyncio.sleep(opening_delay_s(spec))
    budget = shard_budget(ctx, spec)
    expected = left_to_send(spec, skip)
    stats = await send_and_hand_back(ctx, spec, requests, sink, writer, budget, expected=expected)
    out_of_budget = budget is not None and budget.exhausted
    if out_of_budget:
        await asyncio.to_thread(write_unsent, ctx.s3, spec, source, skip | seen, writer.add_invalid)
    await writer.aflush(finished=False)
    return Submitted(
        submitted=out_of_budget or not stats.stopped_early,
        run=checkpoint.runs + 1,
        wait_seconds=ctx.settings.poll_seconds,
        waiting_since=spec.waiting_since or time.time(),
    )


def _submit_sink(api: BackgroundApi, writer: PartWriter, direct: set[int], seen: set[int]) -> Callable[[Outcome], None]:
    """Where a submit run's outcomes go: a direct line's answer and a failure to the outputs, a
    response that settled at once as its answer, one still running to the item rows."""

    def sink(outcome: Outcome) -> None:
        seen.add(outcome.line)
        if outcome.line in direct:
            direct.discard(outcome.line)
            writer.add_outcome(outcome, path=Mode.DIRECT)
            return
        if not outcome.ok or not isinstance(outcome.body, dict):
            writer.add_outcome(outcome)
            return
        settled = api.settle(outcome.body)
        if settled is not None:
            writer.add_outcome(_settled_outcome(outcome, settled))
            return
        writer.add_pending(
            ItemState(
                outcome.line,
                outcome.custom_id,
                "submitted",
                api.response_id(outcome.body),
                outcome.attempts,
                swept=outcome.swept,
            )
        )

    return sink


def _settled_outcome(outcome: Outcome, settled: Settled) -> Outcome:
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
        swept=outcome.swept,
    )


async def collect_background(ctx: ShardContext, spec: ShardSpec) -> Collected:
    """Poll every submitted response once; settle the finished ones, keep waiting for the rest."""
    checkpoint = load_checkpoint(ctx.s3, spec)
    waiting = {
        i.line: i
        for i in ctx.store.items(spec.job_id, spec.shard)
        if i.status in ("submitted", "settled") and i.provider_id and i.line not in checkpoint.done
    }
    writer = PartWriter(
        s3=ctx.s3,
        store=ctx.store,
        spec=spec,
        run=checkpoint.runs + 1,
        path=Mode.BACKGROUND,
        progress=ctx.progress,
        cache=fill_for(ctx, spec, run=checkpoint.runs + 1, path=Mode.BACKGROUND),
    )
    still: list[int] = []
    # items a webhook settled were already counted off the shard's wait; the rest are counted here
    unsettled_done = 0
    elapsed = time.time() - (spec.waiting_since or time.time())
    expired = elapsed > BACKGROUND_MAX_WAIT_S
    api = ctx.background

    def sink(outcome: Outcome) -> None:
        nonlocal unsettled_done
        if outcome.ok and isinstance(outcome.body, dict):
            settled = api.settle(outcome.body)
            if settled is None and not expired:
                still.append(outcome.line)
                return
            if settled is None:
                hours = BACKGROUND_MAX_WAIT_S / 3600
                status = api.status(outcome.body)
                message = f"background response still {status} after {hours:g} hours"
                settled = Settled(status, outcome.body, ErrorCode.EXPIRED, message)
            outcome = _settled_outcome(outcome, settled)
        item = waiting[outcome.line]
        # the line's sends are its submission's; a poll is not one, but a poll sent again is a retry
        outcome.attempts = item.attempts + outcome.attempts - 1
        # a line the last sweep submitted counts as swept when its response is collected
        outcome.swept = item.swept
        unsettled_done += item.status == "submitted"
        writer.add_outcome(outcome, provider_id=item.provider_id)

    requests = [api.poll_request(i.line, i.custom_id, i.provider_id or "") for i in waiting.values()]
    try:
        stats = await send_requests(ctx, spec, requests, sink, expected=len(requests))
    except asyncio.CancelledError:
        await writer.aflush(finished=False, waiting=-unsettled_done)
        raise
    left = len(still) + stats.remaining
    finished = left == 0 and not stats.stopped_early
    await writer.aflush(finished=finished, waiting=-unsettled_done)
    if finished:
        assemble(ctx.s3, spec)
    return Collected(done=finished, waiting=left, wait_seconds=poll_wait_seconds(ctx.settings, elapsed))
