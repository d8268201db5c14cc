"""Why the core calls AWS: every call a step makes runs under a declared cause.

A cause names what triggered a call (a line, a part's flush, a lease, a run's start, a poll, ...)
and what one occurrence of it is, so that calls are counted per occurrence: a part's flush writes
one object and one progress item whatever the job's size, a line settled writes its one item.
`bench/capacity` counts the calls of each cause in small local runs and scales them by each
cause's rate at a large job, which it derives from the settings and from the periods the code
declares here (`because(..., period_s=...)`), never from how busy a small run happened to be.

Outside a run that observes (every Lambda on AWS), `because` sets a context variable and nothing
else. Standard library only, like the rest of the contract.
"""

from __future__ import annotations

import contextvars
import enum
import functools
import inspect
import itertools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


class Per(enum.Enum):
    """What one occurrence of a cause is, which is what its rate at a large job is derived from."""

    # the job's lines, in whichever of its shards: the key's rate shared by the shards in flight
    LINE = "line"
    # a shard, once in a job (Plan or Merge going through the shards one by one)
    SHARD = "shard"
    # a shard's Lambda run: its start or its end, every run's length, and the opening wave
    RUN = "run"
    # the job, once
    JOB = "job"
    # every `period_s` of each running shard, as the code declares it at the call
    PERIOD = "period"
    # a part a shard writes: at most every `period_s`, or sooner when it fills with lines
    PART = "part"
    # a lease of the key's shared limit: at most one a `min_period_s`, at least `min_requests` requests
    LEASE = "lease"
    # a budget chunk, reserved for `CHUNK_REQUESTS` requests (and once at a run's start)
    CHUNK = "chunk"
    # a waiting shard's poll, on the poll schedule (background responses, batches, budget holders)
    POLL = "poll"
    # a batch part submitted or collected (one a shard in batch mode)
    BATCH = "batch"
    # a segment of the response cache read or written
    SEGMENT = "segment"
    # a conditional write lost to another writer, tried again: bounded on paper (docs/capacity.md)
    RACE = "race"
    # a shared item made, claimed or learned: once a key until it expires, at most once a run of
    # the opening wave; bounded on paper like a race
    ONCE = "once"


@dataclass(frozen=True, slots=True)
class Cause:
    name: str
    per: Per


PLAN = Cause("plan", Per.JOB)
PLAN_SHARD = Cause("plan: a shard's row", Per.SHARD)
CACHE_READ = Cause("cache: a segment read", Per.SEGMENT)
RUN = Cause("a shard's run", Per.RUN)
SHARD_END = Cause("a shard's end", Per.RUN)
PART = Cause("a part's flush", Per.PART)
PART_ROWS = Cause("a part's rows and figures written", Per.PART)
PART_ANSWERED = Cause("a part's answered lines recorded on its shard's partition", Per.PART)
CACHE_WRITE = Cause("a part's answers written to the response cache", Per.PART)
PART_READ = Cause("a part read back at its shard's end", Per.PART)
SECRET = Cause("a secret read on a cold or expired cache", Per.RUN)
LOOK = Cause("a run's first look at the key's shared limit", Per.RUN)
FIRST = Cause("the key's shared limit or batch queue made, claimed, learned or joined", Per.ONCE)
LOOK_AGAIN = Cause("a look again at the key's shared limit, while it is unknown", Per.ONCE)
GIVE_BACK = Cause("a run's unused lease given back", Per.RUN)
LINE = Cause("a line settled", Per.LINE)
# each attempt of a request signed with the function's credentials (Bedrock's runtime): an AWS call
SIGNED = Cause("a provider request signed with the function's AWS credentials", Per.LINE)
CANCEL_CHECK = Cause("the stop mark's check", Per.PERIOD)
LEASE = Cause("a lease's look at the key's shared limit", Per.LEASE)
LEASE_TAKEN = Cause("a lease's grant written", Per.LEASE)
BUDGET_CHUNK = Cause("a budget chunk", Per.CHUNK)
BUDGET_PART = Cause("a batch part's worst case taken from the budget", Per.BATCH)
BUDGET_WAIT = Cause("a wait for the budget's holders", Per.POLL)
POLL = Cause("a waiting shard's poll", Per.POLL)
BATCH_SUBMIT = Cause("a batch part's submit", Per.BATCH)
BATCH_COLLECT = Cause("a batch part's collect", Per.BATCH)
WEBHOOK = Cause("a webhook", Per.LINE)
BATCH_WEBHOOK = Cause("a batch's webhook or job-state event", Per.BATCH)
SETTLE = Cause("a line settled by its webhook", Per.LINE)
WAKE = Cause("a waiting shard woken", Per.RUN)
WAKE_AGAIN = Cause("a waiting shard woken again by a repeat delivery", Per.RACE)
EARLY = Cause("a webhook that came before its row", Per.RACE)
REPEAT = Cause("a line settled again (its webhook and its shard both saw it)", Per.RACE)
RACE = Cause("a write tried again after a lost race", Per.RACE)
THROTTLED = Cause("a 429's pause or a changed rate, shared", Per.RACE)
# the provider's batch queue was full: a waiting shard's poll tries its parts again, as often as it stays full
REQUEUED = Cause("a poll that tries again a batch part the provider's queue had no room for", Per.RACE)
MERGE = Cause("merge", Per.JOB)
SHARD_OUTPUTS = Cause("a shard's outputs read or marked, by Merge or MarkFailed", Per.SHARD)
COMPACT = Cause("merge: a compaction slice", Per.JOB)
NOTIFY = Cause("notify", Per.JOB)
MARK_FAILED = Cause("mark failed", Per.JOB)
# once a shard run that failed, as its run ends: a run's rate, not a pass through the shards
SHARD_FAILED = Cause("a failed shard ended: its open work cancelled, its outputs written", Per.RUN)
SLOT = Cause("a shard's slot among the shards in flight, taken at its start or given back at its end", Per.RUN)
SLOT_WAIT = Cause("a look again for a slot among the shards in flight", Per.POLL)
SLOT_HOUR = Cause("the slots among the shards in flight made, or moved on to a new hour", Per.ONCE)
# a user's command, outside any step: `sluice cancel` ends a job once; `sluice status` and the
# cache's commands read what a job or the cache holds, as often as the user asks
CANCEL = Cause("sluice cancel", Per.JOB)
USER = Cause("a user's look at a job or the cache (sluice status, cache)", Per.JOB)

CAUSES: tuple[Cause, ...] = (
    PLAN,
    PLAN_SHARD,
    CACHE_READ,
    RUN,
    SHARD_END,
    PART,
    PART_ROWS,
    PART_ANSWERED,
    CACHE_WRITE,
    PART_READ,
    SECRET,
    LOOK,
    FIRST,
    LOOK_AGAIN,
    GIVE_BACK,
    LINE,
    SIGNED,
    CANCEL_CHECK,
    LEASE,
    LEASE_TAKEN,
    BUDGET_CHUNK,
    BUDGET_PART,
    BUDGET_WAIT,
    POLL,
    BATCH_SUBMIT,
    BATCH_COLLECT,
    WEBHOOK,
    BATCH_WEBHOOK,
    SETTLE,
    WAKE,
    WAKE_AGAIN,
    EARLY,
    REPEAT,
    RACE,
    THROTTLED,
    REQUEUED,
    MERGE,
    SHARD_OUTPUTS,
    COMPACT,
    NOTIFY,
    MARK_FAILED,
    SLOT,
    SLOT_WAIT,
    SLOT_HOUR,
    SHARD_FAILED,
    CANCEL,
    USER,
)


# what a step's invocation is, for the calls no narrower cause claims (its handler's module is the step)
STEP_CAUSES: dict[str, Cause] = {
    "plan": PLAN,
    "take_slot": SLOT,
    "give_back_slot": SLOT,
    "run_shard": RUN,
    "submit": RUN,
    "await_shard": RUN,
    "collect": RUN,
    "submit_batch": BATCH_SUBMIT,
    "collect_batch": RUN,
    "merge": MERGE,
    "notify": NOTIFY,
    "mark_failed": MARK_FAILED,
    "fail_shard": SHARD_FAILED,
    "webhook": WEBHOOK,
}


_serials = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Occurrence:
    cause: Cause
    count: int
    period_s: float | None
    # lines an occurrence comes at most once per, besides its period (a part fills, a chunk runs out)
    every: int | None = None
    # which occurrence this is: `instead` tells the observer the same one again, as another cause
    serial: int = field(default_factory=lambda: next(_serials), compare=False)


_current: contextvars.ContextVar[Occurrence | None] = contextvars.ContextVar("sluice_cause", default=None)
_observer: Callable[[Occurrence], None] | None = None


def observe(observer: Callable[[Occurrence], None] | None) -> None:
    """Tell `observer` of every occurrence from now on (None: stop); the local cloud's ledger does."""
    global _observer
    _observer = observer


@contextmanager
def because(cause: Cause, *, count: int = 1, period_s: float | None = None, every: int | None = None) -> Iterator[None]:
    """The calls made meanwhile (on this task, and the tasks and threads it starts) are `count`
    occurrences of `cause`; a time-driven cause says its period, and one that also comes with
    lines (a part, a chunk, a lease) how many lines it comes once per at most."""
    occurrence = Occurrence(cause, count, period_s, every)
    if _observer is not None:
        _observer(occurrence)
    token = _current.set(occurrence)
    try:
        yield
    finally:
        _current.reset(token)


def caused(cause: Cause) -> Callable[[F], F]:
    """A function whose every call is one occurrence of `cause` (a coroutine function's too)."""

    def wrap(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with because(cause):
                    return await fn(*args, **kwargs)

            return cast(F, run_async)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with because(cause):
                return fn(*args, **kwargs)

        return cast(F, run)

    return wrap


def under(*declared: Cause) -> Callable[[F], F]:
    """A function whose AWS calls run under one of `declared`, which its callers declare (with
    `because`, `caused`, or a step's handler: `STEP_CAUSES`). It changes nothing at run time: it
    is the declaration `bench/scale/undeclared.py` reads, so that no call reaches AWS under no
    cause its code names; the causes themselves are what the callers' `because` make them."""

    def mark(fn: F) -> F:
        vars(fn)["__sluice_causes__"] = declared
        return fn

    return mark


def again(attempt: int) -> AbstractContextManager[None]:
    """An attempt of a read-change-write loop: the first is its caller's, each later one a lost race."""
    return because(RACE) if attempt > 1 else nullcontext()


def instead(cause: Cause) -> None:
    """The occurrence under way turned out to be one of `cause` (its conditional write lost a race
    or found the work done, a webhook was a batch's): it counts as that, its calls so far included."""
    occurrence = _current.get()
    if occurrence is None or occurrence.cause == cause:
        return
    became = replace(occurrence, cause=cause, period_s=None, every=None)
    if _observer is not None:
        _observer(became)
    _current.set(became)


def current() -> Occurrence | None:
    return _current.get()
