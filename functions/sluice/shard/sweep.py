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
from dataclasses import dataclass, field
from typing import Any

from sluice.contract.model import ErrorCode, Outcome, Request
from sluice.core.retry import (
    LINE_ATTEMPTS_CEILING,
    SWEEP_MAX_S,
    fault_rate,
    first_pass_attempts,
    line_attempts,
)

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


@dataclass(frozen=True)
class Timing:
    """The clocks, sleep and jitter a run's sweep paces its rounds by; tests pass their own."""

    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    rand: Callable[[], float] = random.random


@dataclass
class Held:
    """A run's sends as the sweep sees them: the requests the engine holds now (at most its worker
    pool), so a failed one is kept as the Request it was, not re-read and not copied; the lines
    held aside for the sweep; and the faults of the lines ended, which size a held line's rounds.
    Every outcome that ends a line goes on to `sink`."""

    sink: Callable[[Outcome], None]
    # whether lines are held at all: not when the cap leaves the sweep no attempts
    sweeps: bool
    first_pass: int
    in_flight: dict[int, Request] = field(default_factory=dict)
    lines: dict[int, tuple[Request, Outcome]] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)

    def ended(self, outcome: Outcome) -> None:
        self.faults.add(outcome)
        self.sink(outcome)

    def tracked(self, requests: Iterable[Request]) -> Iterator[Request]:
        for request in requests:
            self.in_flight[request.line] = request
            yield request

    def hold_or_pass(self, outcome: Outcome) -> None:
        request = self.in_flight.pop(outcome.line, None)
        if request is not None and self.sweeps and sweepable(outcome):
            self.lines[outcome.line] = (request, outcome)
            return
        self.ended(outcome)

    def swept(self, outcome: Outcome) -> None:
        request, before = self.lines[outcome.line]
        outcome = merged(before, outcome)
        if sweepable(outcome):
            # still failing: whether it goes again is the next round's to say
            self.lines[outcome.line] = (request, outcome)
            return
        del self.lines[outcome.line]
        self.ended(outcome)

    def end(self, why: str) -> None:
        for _, outcome in self.lines.values():
            self.ended(gave_up(outcome, self.first_pass, why))
        self.lines.clear()

    def again(self) -> list[Request]:
        return [request for request, _ in self.lines.values()]

    def no_more(self, cap: int, late: bool, cutover: bool) -> str:
        """Why the sweep's rounds ended with lines still failing."""
        return _no_more(cap, self.faults, late, cutover)


def late(started: float, now: float) -> bool:
    """Whether the sweep's time is up: no round but the first starts SWEEP_MAX_S after it began."""
    return now - started >= SWEEP_MAX_S
