"""The frame every mode shares: what a shard is, what its run needs from outside, how its lines are
read, and when a run stops.

A shard is a byte range of the input object. Each mode (`direct`, `background`, `batch`) runs it
through a `sluice.shard.run.ShardRun`, which reads its lines here, checkpoints terminal outcomes
through `parts`, and stops (`Stopper`) when the Lambda's time is nearly up or the job is cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import orjson

from sluice.contract import Settings, causes
from sluice.contract import ShardSpec as ShardSpec  # the contract's, which the modes import from here
from sluice.contract.model import ErrorCode, Request
from sluice.formats.lines import READ_CHUNK, LineError, parse_line, split_lines
from sluice.providers import Signer, apis, family
from sluice.providers.background import BackgroundApi
from sluice.providers.batch import BatchApi, BatchApiOpener
from sluice.send.engine_settings import SessionFactory
from sluice.shard.progress import ProgressSink
from sluice.store.jobs import JobStore


def poll_wait_seconds(settings: Settings, elapsed_s: float) -> int:
    """How long a shard sleeps before it polls again. Webhooks end the wait as soon as the work
    ends, so polling only reconciles, and backs off as the work ages: each wait is a tenth of
    the time waited so far, between `poll_seconds` and `batch_poll_max_s`. Over 24 hours that
    is about 330 loops, where a fixed 10 s would be 8,640 (and 25,000 history events in 5 hours)."""
    return int(max(settings.poll_seconds, min(settings.batch_poll_max_s, elapsed_s / 10)))


@causes.under(causes.RUN, causes.BATCH_SUBMIT, causes.SHARD_FAILED, causes.MARK_FAILED)
def read_shard_lines(s3: Any, spec: ShardSpec) -> Iterator[Request | LineError]:
    """The shard's lines, validated, straight from its byte range of the input object, each body
    as the shard's provider family is sent it."""
    request_format = family(spec.provider)
    duplicates: dict[int, int] = {}
    if spec.duplicates_key:
        raw = s3.get_object(Bucket=spec.bucket, Key=spec.duplicates_key)["Body"].read()
        duplicates = {int(k): v for k, v in orjson.loads(raw).items()}
    body = s3.get_object(Bucket=spec.bucket, Key=spec.key, Range=f"bytes={spec.start}-{spec.end - 1}", **spec.pin)[
        "Body"
    ]
    for offset, raw in enumerate(split_lines(body.iter_chunks(READ_CHUNK))):
        number = spec.first_line + offset
        # a job that fills the cache sends each body with its keys sorted: the one encode the body
        # needs anyway is then also its canonical form, which the cache key hashes as it is
        parsed = parse_line(
            raw,
            number,
            model=spec.model,
            default_model=spec.default_model,
            sort_keys=spec.fills_cache,
            request_format=request_format,
            service_tier=spec.service_tier,
        )
        if parsed is None:
            continue
        if isinstance(parsed, LineError):
            yield parsed
        elif number in duplicates:
            yield LineError(
                number,
                ErrorCode.DUPLICATE_CUSTOM_ID,
                f"line {number}: duplicate custom_id {parsed.custom_id!r} (first on line {duplicates[number]})",
                parsed.custom_id,
            )
        else:
            yield parsed


@dataclass(frozen=True)
class LocalDeps:
    """What only the local cloud hands a function, beside its Lambda context (the handlers read it
    from the context's `local`): a deployed function has none, and uses its runtime's own."""

    # sessions it can abandon when `sluice run` is interrupted
    session_factory: SessionFactory | None = None
    # `sluice run`'s live progress
    progress: ProgressSink | None = None
    # the step's `bedrock` client: the local cloud's emulation of Bedrock's batch jobs
    bedrock: Callable[[], Any] | None = None
    # the user's signer when `sluice run` sends to their Bedrock endpoint
    sign: Signer | None = None


DEPLOYED = LocalDeps()


@dataclass
class ShardContext:
    """What a shard run needs from outside; handlers build it, tests pass fakes."""

    s3: Any
    store: JobStore
    settings: Settings
    api_key: str
    remaining_s: Callable[[], float]
    session_factory: SessionFactory
    # in-process listener for live progress (the local cloud's display); deployed, there is none
    progress: ProgressSink | None = None
    # the provider's Batch API and background responses (`sluice.providers`), as the handler chose
    # them; None: those of the family the settings name
    batch_api: BatchApiOpener | None = None
    background_api: BackgroundApi | None = None
    # a family that signs each request with the function's AWS credentials (Bedrock): how; `api_key` is then ""
    sign: Signer | None = None

    def batches(self) -> AbstractAsyncContextManager[BatchApi]:
        """The provider's Batch API, open for one run."""
        return (self.batch_api or apis.batch_api_for(self.settings, self.api_key))()

    @property
    def background(self) -> BackgroundApi:
        return self.background_api or apis.background_api(self.settings.provider)


def margin_s(ctx: ShardContext) -> float:
    """Time a run keeps in hand: one request may still be in flight when it stops taking more."""
    return ctx.settings.request_timeout_s + ctx.settings.safety_margin_s


# The shards of a job's first wave start together; each waits `opening_delay_s` before its first
# request, so that at most this many a second make their first reads and writes of the items every
# shard shares (the key's limit, the job row's budget): at 1,000 shards in flight the openings
# spread over 50 s, and the items take the openings of 100 shards in any 5 seconds, not 1,000
OPENINGS_PER_S = 20.0


def opening_delay_s(spec: ShardSpec) -> float:
    """How long the shard's first run waits before its first request: its place in the first wave
    (shards beyond it start as others end, already spread)."""
    return spec.shard / OPENINGS_PER_S if spec.shard < spec.running else 0.0


# how often a running shard reads its stop mark: a cancelled or failed job stops sending within this
CANCEL_CHECK_S = 5.0


class Stopper:
    """When a run stops taking items: the Lambda's time is nearly up, or the job was cancelled or
    has failed.

    Neither stopping the execution (`sluice cancel`) nor a failed Map (MarkFailed) stops a Lambda
    that is already running, so both mark every shard row (`JobStore.stop_shards`) and the run
    reads the mark on its own row when it starts and every CANCEL_CHECK_S after: one read a period
    per shard, each on the shard's own partition, never an item every shard reads. `stopped` is
    the job's status then.
    """

    def __init__(self, ctx: ShardContext, spec: ShardSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self._ctx = ctx
        self._spec = spec
        self._clock = clock
        self._margin = margin_s(ctx)
        # a run that starts after the mark (the workflow had not stopped the shard yet) sends nothing
        self._next_check = clock()
        self.stopped: str | None = None

    def __call__(self) -> bool:
        if self._ctx.remaining_s() < self._margin:
            return True
        now = self._clock()
        if self.stopped is None and now >= self._next_check:
            self._next_check = now + CANCEL_CHECK_S
            with causes.because(causes.CANCEL_CHECK, period_s=CANCEL_CHECK_S):
                self.stopped = self._ctx.store.stop_mark(self._spec.job_id, self._spec.shard)
        return self.stopped is not None


def budget_message(spec: ShardSpec) -> str:
    # how to send the rest depends on where the job ran: `sluice status` and `sluice run` say it
    return f"not sent: the job's budget of ${spec.budget_usd:g} is spent"


def unsent(spec: ShardSpec, line: int, custom_id: str) -> LineError:
    """The error of a line the job's budget did not let the shard send."""
    return LineError(line, ErrorCode.BUDGET_EXCEEDED, f"line {line}: {budget_message(spec)}", custom_id)


def pending(s3: Any, spec: ShardSpec, skip: set[int], on_invalid: Callable[[LineError], None]) -> Iterator[Request]:
    """Requests still to send; invalid lines go to `on_invalid` as they stream past.

    A shard whose every line already has its outcome (Plan answered them all from the response
    cache, or an earlier run finished them) is not read at all.
    """
    if len(skip) >= spec.lines - spec.blank:
        return
    for item in read_shard_lines(s3, spec):
        if item.line in skip:
            continue
        if isinstance(item, LineError):
            on_invalid(item)
        else:
            yield item
