"""The last sweep: lines whose first attempts ran out on transient failures get one more pass.

Under random 429s and 5xx, a few lines in every few thousand draw a bad answer on each of
their attempts. Rather than spending all of a line's attempts at once, a run gives the first
pass the first half of them (`split_attempts`); a line that fails all of those transiently is
held aside and, once the rest of its requests are done, sent again with the other half and
backoff at a small concurrency, so a provider that is still recovering is not hammered. A
line is sent at most `max_attempts` times in all. Failures retrying cannot fix (a 400, an
invalid line) are never held and never re-sent.

A held line is in no checkpoint part until the sweep ends it. A run that stops early (the
Lambda's time is nearly up) just drops what it holds: those lines are not in a part, so the
next run reads them as pending again. A line is therefore either checkpointed once, with
its final outcome, or re-read; never lost and never counted twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from sluice.contract.model import ErrorCode, Outcome, Request
from sluice.limits.budget import Budget
from sluice.send.engine import EngineStats
from sluice.shard.frame import ShardContext, ShardSpec, Stopper, refusal_watch, send_requests
from sluice.shard.parts import PartWriter

# the sweep's concurrency: a tenth of the shard's (at least this, at most the shard's own)
SWEEP_MIN_CONCURRENCY = 4
SWEEP_SHARE = 0.1


def sweepable(outcome: Outcome) -> bool:
    """Whether a failed line is worth one more pass: its attempts ran out on transient causes."""
    return outcome.error_code == ErrorCode.RETRIES_EXHAUSTED


def sweep_concurrency(concurrency: int) -> int:
    return min(concurrency, max(SWEEP_MIN_CONCURRENCY, int(concurrency * SWEEP_SHARE)))


def split_attempts(max_attempts: int) -> tuple[int, int]:
    """(the first pass's attempts, the last sweep's) of a line: together `max_attempts`, the
    sweep's the smaller half (none for a line of one attempt)."""
    sweep = max_attempts // 2
    return max_attempts - sweep, sweep


def merged(first: Outcome, last: Outcome) -> Outcome:
    """The sweep's outcome of a line, carrying the attempts and 429s of its first pass too."""
    swept = last.attempts
    last.attempts += first.attempts
    last.throttled += first.throttled
    last.swept = True
    if not last.ok and last.error_message:
        # the engine counts the sweep's attempts only; the line's are both passes'
        counted = f"gave up after {swept} attempts"
        both = f"{last.attempts} attempts ({first.attempts}, then {swept} in the shard's last sweep)"
        if last.error_message.startswith(counted):
            last.error_message = f"gave up after {both}{last.error_message.removeprefix(counted)}"
        else:
            last.error_message = f"{last.error_message} (in the shard's last sweep, after {first.attempts} attempts)"
    return last


async def send_with_sweep(
    ctx: ShardContext,
    spec: ShardSpec,
    requests: Iterable[Request],
    sink: Callable[[Outcome], None],
    stopper: Stopper | None = None,
    budget: Budget | None = None,
    *,
    expected: int | None = None,
) -> EngineStats:
    """`send_requests`, then one more pass over the lines that failed transiently. `expected`: at
    most how many `requests` there are, when the caller knows.

    Once the job's `budget` is spent, a held line keeps the outcome it had: it is not sent again.

    The stats are the main pass's; `stopped_early` is also true when the sweep ran out of
    time before taking every held line (the rest are pending for the next run).
    """
    stopper = stopper or Stopper(ctx, spec)
    first_pass, last_pass = split_attempts(spec.max_attempts)
    # the requests the engine holds now (at most its worker pool), so a failed one is kept
    # as the Request it was, not re-read and not copied
    in_flight: dict[int, Request] = {}
    held: dict[int, tuple[Request, Outcome]] = {}

    def tracked() -> Iterator[Request]:
        for request in requests:
            in_flight[request.line] = request
            yield request

    def hold_or_pass(outcome: Outcome) -> None:
        request = in_flight.pop(outcome.line, None)
        if request is not None and last_pass and sweepable(outcome):
            held[outcome.line] = (request, outcome)
            return
        sink(outcome)

    # one watch for both passes: a 5xx on every attempt is a refusal once it lasts (`refusal`)
    refusals = refusal_watch(spec)
    first = replace(spec, max_attempts=first_pass)
    stats = await send_requests(
        ctx, first, tracked(), hold_or_pass, stopper, budget, expected=expected, refusals=refusals
    )
    in_flight.clear()
    if not held:
        return stats
    if stopper.stopped or stats.refused is not None or (budget is not None and budget.exhausted):
        # the job was cancelled or has failed, the provider refused the run (`refusal`: a 5xx on
        # every attempt), or its budget is spent: what these lines last got is their outcome
        for _, outcome in held.values():
            sink(outcome)
        return stats
    if stats.stopped_early:
        return stats

    def swept(outcome: Outcome) -> None:
        sink(merged(held.pop(outcome.line)[1], outcome))

    again = [request for request, _ in held.values()]
    sweep = replace(spec, concurrency=sweep_concurrency(spec.concurrency), max_attempts=last_pass)
    last = await send_requests(ctx, sweep, again, swept, stopper, budget, expected=len(again), refusals=refusals)
    if last.refused is not None:
        # still failing every attempt: the lines not swept yet keep what their first pass got
        stats.refused, stats.given_up = last.refused, last.given_up
    if stopper.stopped or stats.refused is not None or (budget is not None and budget.exhausted):
        for _, outcome in held.values():
            sink(outcome)
        held.clear()
    stats.stopped_early = bool(held)
    stats.remaining = len(held)
    return stats


async def send_and_hand_back(
    ctx: ShardContext,
    spec: ShardSpec,
    requests: Iterable[Request],
    sink: Callable[[Outcome], None],
    writer: PartWriter,
    budget: Budget | None,
    stopper: Stopper | None = None,
    *,
    expected: int | None = None,
) -> EngineStats:
    """A run's `send_with_sweep`: given up mid-flight (an interrupted local run), what was answered
    (and, in background, the responses created) is checkpointed first, as a run that stops early
    would; however it ends, the budget's pool goes back to the job row."""
    try:
        return await send_with_sweep(ctx, spec, requests, sink, stopper, budget, expected=expected)
    except asyncio.CancelledError:
        await writer.aflush(finished=False)
        raise
    finally:
        if budget is not None:
            await asyncio.to_thread(budget.close)
