"""The last sweep: lines whose first attempts ran out on transient failures get more passes.

Under random 429s and 5xx, a few lines in every few thousand draw a bad answer on each of
their attempts. Rather than spending all of a line's attempts at once, a run gives each line
a few in its first pass; a line that fails all of those transiently is held aside and, once
the rest of its requests are done, sent again in rounds with backoff at a small concurrency,
so a provider that is still recovering is not hammered. Failures retrying cannot fix (a 400,
an invalid line) are never held and never re-sent.

How many rounds (`sluice.core.retry`): with the user's --max-attempts, one, of what the cap
leaves. Without, rounds go on while a held line has had fewer attempts than the shard's faults
call for (`line_attempts`): under random faults at the rate the shard's ended lines saw, a line
then ends in errors with chance below 1e-8, 0.01 lines a million. A line failing where most
succeed reads as a small rate, and ends at the six attempts of a cap of six. A provider that
fails everything is the refusal watch's (`sluice.send.refusal`), which ends the sweep too, as
do a spent budget and a stopped job (cancelled, failed). No round but the first starts
SWEEP_MAX_S after the first began, nor past a deadline job's cutover (its shard then sends
what its batch left directly, and the deadline comes first).

A held line is in no checkpoint part until the sweep ends it. A run that stops early (the
Lambda's time is nearly up) just drops what it holds: those lines are not in a part, so the
next run reads them as pending again. A line is therefore either checkpointed once, with
its final outcome, or re-read; never lost and never counted twice.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from sluice.contract.model import ErrorCode, Outcome, Request
from sluice.core.retry import (
    LINE_ATTEMPTS_CEILING,
    SWEEP_MAX_S,
    RetryPolicy,
    backoff_s,
    fault_rate,
    first_pass_attempts,
    line_attempts,
    sweep_round_attempts,
)
from sluice.limits.budget import Budget
from sluice.send.engine import EngineStats
from sluice.shard.frame import ShardContext, ShardSpec, Stopper, refusal_watch, send_requests
from sluice.shard.parts import PartWriter

# the sweep's concurrency: a tenth of the shard's (at least this, at most the shard's own)
SWEEP_MIN_CONCURRENCY = 4
SWEEP_SHARE = 0.1

_GAVE_UP = re.compile(r"^gave up after \d+ attempts")


def sweepable(outcome: Outcome) -> bool:
    """Whether a failed line is worth one more pass: its attempts ran out on transient causes."""
    return outcome.error_code == ErrorCode.RETRIES_EXHAUSTED


def sweep_concurrency(concurrency: int) -> int:
    return min(concurrency, max(SWEEP_MIN_CONCURRENCY, int(concurrency * SWEEP_SHARE)))


def split_attempts(max_attempts: int) -> tuple[int, int]:
    """(the first pass's attempts, the last sweep's) of a line under a cap of `max_attempts`:
    together the cap, the sweep's the smaller half (none for a line of one attempt)."""
    first = first_pass_attempts(max_attempts)
    return first, max_attempts - first


def merged(first: Outcome, last: Outcome) -> Outcome:
    """The sweep's outcome of a line, carrying the attempts and 429s of its passes before too."""
    last.attempts += first.attempts
    last.throttled += first.throttled
    last.swept = True
    if not last.ok and last.error_message and not sweepable(last):
        last.error_message = f"{last.error_message} (in the shard's last sweep, after {first.attempts} attempts)"
    return last


def gave_up(outcome: Outcome, first_pass: int, why: str) -> Outcome:
    """A held line's outcome as it ends in errors: its attempts, the first pass's and the sweep's, and
    `why` the sweep sent it no more."""
    if not outcome.swept:
        if outcome.error_message:
            outcome.error_message = f"{outcome.error_message} (not swept: {why})"
        return outcome
    swept = outcome.attempts - first_pass
    both = f"gave up after {outcome.attempts} attempts ({first_pass}, then {swept} in the shard's last sweep), {why}"
    message = outcome.error_message or ""
    if _GAVE_UP.match(message):
        outcome.error_message = _GAVE_UP.sub(both, message, count=1)
    else:
        outcome.error_message = f"{message} ({both})"
    return outcome


@dataclass(slots=True)
class Faults:
    """The attempts of the lines a run ended, and how many of them failed on transient causes: the
    rate the sweep sizes a held line's attempts by (`line_attempts`)."""

    attempts: int = 0
    failed: int = 0

    def add(self, outcome: Outcome) -> None:
        if outcome.ok:
            self.attempts += outcome.attempts
            self.failed += outcome.attempts - 1
        elif sweepable(outcome):
            self.attempts += outcome.attempts
            self.failed += outcome.attempts


def _no_more(cap: int, faults: Faults, late: bool, cutover: bool) -> str:
    """Why the sweep's rounds ended with lines still failing."""
    if cutover:
        return "the deadline's cutover has passed"
    if late:
        return f"the sweep's {SWEEP_MAX_S:.0f} s were up"
    if cap:
        return f"the job's max-attempts of {cap}"
    rate = fault_rate(faults.failed, faults.attempts)
    if line_attempts(faults.failed, faults.attempts) >= LINE_ATTEMPTS_CEILING:
        return f"the most a line is sent, {LINE_ATTEMPTS_CEILING}, with {rate:.0%} of the shard's attempts failing"
    return f"as many as {rate:.0%} of the shard's attempts failing call for"


async def send_with_sweep(
    ctx: ShardContext,
    spec: ShardSpec,
    requests: Iterable[Request],
    sink: Callable[[Outcome], None],
    stopper: Stopper | None = None,
    budget: Budget | None = None,
    *,
    expected: int | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    rand: Callable[[], float] = random.random,
) -> EngineStats:
    """`send_requests`, then the last sweep's rounds over the lines that failed transiently.
    `expected`: at most how many `requests` there are, when the caller knows.

    Once the job's `budget` is spent, a held line keeps the outcome it had: it is not sent again.

    The stats are the first pass's; `stopped_early` is also true when a round ran out of
    time before taking every held line (the rest are pending for the next run).
    """
    stopper = stopper or Stopper(ctx, spec)
    cap = spec.max_attempts
    first_pass = given = first_pass_attempts(cap)
    sweeps = sweep_round_attempts(given, cap, LINE_ATTEMPTS_CEILING) > 0
    # the requests the engine holds now (at most its worker pool), so a failed one is kept
    # as the Request it was, not re-read and not copied
    in_flight: dict[int, Request] = {}
    held: dict[int, tuple[Request, Outcome]] = {}
    faults = Faults()

    def ended(outcome: Outcome) -> None:
        faults.add(outcome)
        sink(outcome)

    def tracked() -> Iterator[Request]:
        for request in requests:
            in_flight[request.line] = request
            yield request

    def hold_or_pass(outcome: Outcome) -> None:
        request = in_flight.pop(outcome.line, None)
        if request is not None and sweeps and sweepable(outcome):
            held[outcome.line] = (request, outcome)
            return
        ended(outcome)

    def end_held(why: str) -> None:
        for _, outcome in held.values():
            ended(gave_up(outcome, first_pass, why))
        held.clear()

    def swept(outcome: Outcome) -> None:
        request, before = held[outcome.line]
        outcome = merged(before, outcome)
        if sweepable(outcome):
            # still failing: whether it goes again is the next round's to say
            held[outcome.line] = (request, outcome)
            return
        del held[outcome.line]
        ended(outcome)

    # one watch for every pass: a 5xx on every attempt is a refusal once it lasts (`refusal`)
    refusals = refusal_watch(spec)
    stats = await send_requests(
        ctx,
        replace(spec, max_attempts=given),
        tracked(),
        hold_or_pass,
        stopper,
        budget,
        expected=expected,
        refusals=refusals,
    )
    in_flight.clear()

    def over() -> bool:
        return stopper.stopped is not None or stats.refused is not None or (budget is not None and budget.exhausted)

    if not held or (stats.stopped_early and not over()):
        # out of time: what it holds is pending for the next run
        return stats
    if over():
        # the first pass's figures stand: what it left unsent is the caller's to write
        end_held(_stopped(stopper, stats, budget))
        return stats
    concurrency = sweep_concurrency(spec.concurrency)
    pause = RetryPolicy(base_delay_s=ctx.settings.retry_base_delay_s)
    started = clock()
    rounds = 0
    while held:
        if over():
            # the job was cancelled or has failed, the provider refused the run (`refusal`: a 5xx on
            # every attempt), or its budget is spent: what these lines last got is their outcome
            end_held(_stopped(stopper, stats, budget))
            break
        late = rounds > 0 and clock() - started >= SWEEP_MAX_S
        # a deadline job's shard sending directly what its batch left: the deadline comes first
        cutover = rounds > 0 and spec.cutover_at is not None and wall() >= spec.cutover_at
        attempts = sweep_round_attempts(given, cap, line_attempts(faults.failed, faults.attempts))
        if late or cutover or not attempts:
            end_held(_no_more(cap, faults, late, cutover))
            break
        if rounds:
            # longer each round, so a provider still recovering gets the time; not a line's own next
            # backoff (16 s after six attempts), which a line merely unlucky would wait for nothing
            await sleep(backoff_s(rounds, pause, rand))
        again = [request for request, _ in held.values()]
        sweep = replace(spec, concurrency=concurrency, max_attempts=attempts)
        last = await send_requests(ctx, sweep, again, swept, stopper, budget, expected=len(again), refusals=refusals)
        given += attempts
        rounds += 1
        if last.refused is not None:
            # still failing every attempt: the lines not swept yet keep what they last got
            stats.refused, stats.given_up = last.refused, last.given_up
        elif last.stopped_early and not over():
            break
    stats.stopped_early = bool(held)
    stats.remaining = len(held)
    return stats


def _stopped(stopper: Stopper, stats: EngineStats, budget: Budget | None) -> str:
    if stats.refused is not None:
        return "the provider refused the run"
    if budget is not None and budget.exhausted:
        return "the job's budget is spent"
    return f"the job is {(stopper.stopped or 'stopped').lower()}"


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
