"""Background mode: each line becomes a background response, submitted once and polled to its end.

SubmitShard creates the responses and remembers their ids in item rows, CollectShard polls them
until every one has settled (or webhooks settle them first). The requests and what a poll's body
says are the provider's (`providers.background.BackgroundApi`, the shard context's).

A validating job judges each answer where it arrives (a poll's, or a line sent directly). One that
fails is sent again directly, not as a new background response: its line then stays one item that
is written once, by whichever run ends it, and a run that stops before the send again ends leaves
the item as it was, for the next run to poll and judge again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection

from sluice.contract import Collected, Mode, Submitted, causes
from sluice.contract.model import ErrorCode, Outcome, Request
from sluice.providers.background import BackgroundApi, Settled
from sluice.send.output_check import OutputCheck, Resends
from sluice.shard.frame import ShardContext, ShardSpec, pending, poll_wait_seconds
from sluice.shard.parts import PartWriter
from sluice.shard.run import ShardRun
from sluice.store.jobs import ItemState

# A background response still running after this long is reported expired: every wait loop
# adds history events to the shard's execution, which AWS caps at 25,000.
BACKGROUND_MAX_WAIT_S = 24 * 3600.0


async def submit_background(ctx: ShardContext, spec: ShardSpec) -> Submitted:
    """Create a background response per pending line and remember its id in the item row.

    Lines for an endpoint with no background form (chat completions, embeddings, completions)
    are sent directly instead: their answer is final the moment it arrives.
    """
    run = ShardRun(ctx, spec, path=Mode.BACKGROUND)
    writer = run.writer
    skip = set(run.checkpoint.done)
    skip.update(i.line for i in ctx.store.items(spec.job_id, spec.shard) if i.provider_id)
    # lines in flight that were sent directly; a set of the in-flight ones only
    direct: set[int] = set()
    api = ctx.background
    check = OutputCheck.for_spec(spec)
    resends = Resends(check) if check is not None else None
    # a validating job's lines in flight, as read: what their answers are judged against
    asked: dict[int, Request] = {}

    def prepare(request: Request) -> Request:
        if resends is not None:
            asked[request.line] = request
        if api.runs_in_background(request):
            return api.submit_request(request)
        direct.add(request.line)
        return request

    sink = _submit_sink(api, writer, direct, resends, asked)

    # keyed as the line asks, before `background: true` is added: a direct run of it shares the answer
    requests = (prepare(r) for r in run.filling(run.pending(skip)))
    await run.opening()
    stats = await run.send(requests, sink, expected=run.left_to_send(skip), budget=run.budget, sweep=True)
    out_of_budget = run.out_of_budget
    if out_of_budget:
        await run.write_unsent()
    left = 0
    if resends is not None and resends.again:
        try:
            left = await _send_again(run, resends, lambda o: writer.add_outcome(o, path=Mode.DIRECT))
        except asyncio.CancelledError:
            await writer.aflush(finished=False)
            raise
    await run.finish(False)
    return Submitted(
        # a line left to send again is in no part and no item: the next submit run sends it afresh
        submitted=out_of_budget or (not stats.stopped_early and left == 0),
        run=run.number,
        wait_seconds=ctx.settings.poll_seconds,
        waiting_since=spec.waiting_since or time.time(),
    )


async def _send_again(run: ShardRun, resends: Resends, write: Callable[[Outcome], None]) -> int:
    """Send directly the answers `resends` turned down, each line's last outcome to `write` with
    the sends before counted in; returns how many lines are left (the run stopped first: the next
    run gets them again). Once the job's budget is spent, a line left keeps its last answer."""
    budget = run.new_budget()
    ended: set[int] = set()

    def sink(outcome: Outcome) -> None:
        ended.add(outcome.line)
        outcome.attempts += resends.first[outcome.line].attempts
        write(outcome)

    again = resends.again
    await run.send(again, sink, expected=len(again), budget=budget, check_answers=True)
    left = [request for request in again if request.line not in ended]
    if budget is not None and budget.exhausted:
        for request in left:
            write(resends.give_up(request, "the job's budget is spent"))
        return 0
    return len(left)


def _submit_sink(
    api: BackgroundApi,
    writer: PartWriter,
    direct: set[int],
    resends: Resends | None,
    asked: dict[int, Request],
) -> Callable[[Outcome], None]:
    """Where a submit run's outcomes go: a direct line's answer and a failure to the outputs, a
    response that settled at once as its answer, one still running to the item rows; an answer
    that fails a validating job's checks is kept in `resends`, to send again once the run is done."""

    def sink(outcome: Outcome) -> None:
        request = asked.pop(outcome.line, None)

        def last(answer: Outcome) -> bool:
            return resends is None or request is None or resends.passes(request, answer)

        if outcome.line in direct:
            direct.discard(outcome.line)
            if last(outcome):
                writer.add_outcome(outcome, path=Mode.DIRECT)
            return
        if not outcome.ok or not isinstance(outcome.body, dict):
            writer.add_outcome(outcome)
            return
        settled = api.settle(outcome.body)
        if settled is not None:
            answer = _settled_outcome(outcome, settled)
            if last(answer):
                writer.add_outcome(answer)
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
    """A waiting shard's poll, on the workflow's schedule (never closer than `poll_seconds`)."""
    with causes.because(causes.POLL, period_s=float(ctx.settings.poll_seconds)):
        return await _collect_background(ctx, spec)


async def _collect_background(ctx: ShardContext, spec: ShardSpec) -> Collected:
    """Poll every submitted response once; settle the finished ones, keep waiting for the rest. A
    validating job's answers are judged once the polls are done, and the invalid ones sent again."""
    run = ShardRun(ctx, spec, path=Mode.BACKGROUND)
    checkpoint, writer = run.checkpoint, run.writer
    waiting = {
        i.line: i
        for i in ctx.store.items(spec.job_id, spec.shard)
        if i.status in ("submitted", "settled") and i.provider_id and i.line not in checkpoint.done
    }
    still: list[int] = []
    # items a webhook settled were already counted off the shard's wait; the rest are counted here
    unsettled_done = 0
    elapsed = time.time() - (spec.waiting_since or time.time())
    expired = elapsed > BACKGROUND_MAX_WAIT_S
    api = ctx.background
    check = OutputCheck.for_spec(spec)
    # a validating job's answers, judged once every poll is in (against the lines, read once)
    arrived: list[Outcome] = []

    def write(outcome: Outcome, path: str | None = None) -> None:
        nonlocal unsettled_done
        item = waiting[outcome.line]
        unsettled_done += item.status == "submitted"
        writer.add_outcome(outcome, provider_id=item.provider_id, path=path)

    def sink(outcome: Outcome) -> None:
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
        if check is not None and outcome.ok:
            arrived.append(outcome)
            return
        write(outcome)

    requests = [api.poll_request(i.line, i.custom_id, i.provider_id or "") for i in waiting.values()]
    try:
        stats = await run.send(requests, sink, expected=len(requests))
        left = len(still) + stats.remaining
        if check is not None and arrived:
            asked = await asyncio.to_thread(_lines_asked, ctx, spec, {outcome.line for outcome in arrived})
            resends = Resends(check)
            for outcome in arrived:
                request = asked.get(outcome.line)
                if request is None or resends.passes(request, outcome):
                    write(outcome)
            if resends.again:
                # sent directly, and priced so; the item keeps its response's id
                left += await _send_again(run, resends, lambda outcome: write(outcome, Mode.DIRECT))
    except asyncio.CancelledError:
        await writer.aflush(finished=False, waiting=-unsettled_done)
        raise
    finished = left == 0 and not stats.stopped_early
    await run.finish(finished, waiting=-unsettled_done)
    return Collected(done=finished, waiting=left, wait_seconds=poll_wait_seconds(ctx.settings, elapsed))


def _lines_asked(ctx: ShardContext, spec: ShardSpec, lines: Collection[int]) -> dict[int, Request]:
    """The shard's requests of `lines`, as read (what their answers are judged against)."""
    skip: set[int] = set()
    return {r.line: r for r in pending(ctx.s3, spec, skip, lambda _: None) if r.line in lines}
