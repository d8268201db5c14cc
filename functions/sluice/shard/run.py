"""A shard's run: one object, opened once with the shard's context and spec, that every mode's runner
works through.

It reads what earlier runs left (the checkpoint) and numbers itself; it holds the writer that
checkpoints its outcomes and the cache that writer fills, the job's budget, the stopper, the lines
still to send as it read them, and the send: the shard's loop (a first pass, then the last sweep's
rounds, `sweep`) over the engine (`sluice.send.engine`). A runner opens the run, hands it its
requests and sink, and finishes it; it does not go back to the frame's readers for any of these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator

from sluice.cache.blobs import cache_store
from sluice.cache.entries import CacheFill, segment_name
from sluice.contract import Mode, RateSeed, parse_rate_limits
from sluice.contract.model import Outcome, Request
from sluice.core.retry import (
    LINE_ATTEMPTS_CEILING,
    RetryPolicy,
    backoff_s,
    first_pass_attempts,
    line_attempts,
    sweep_round_attempts,
    unswept_attempts,
)
from sluice.formats.lines import LineError
from sluice.limits.budget import HOLDERS_WAIT_S, Budget, usd_to_nano
from sluice.limits.shared import SharedLimit
from sluice.limits.table import BucketTable
from sluice.providers import family
from sluice.send.engine import EngineSettings, EngineStats, fan_out
from sluice.send.output_check import OutputCheck
from sluice.send.refusal import REFUSAL_ANSWERS, RefusalWatch
from sluice.shard import sweep
from sluice.shard.assembly import assemble
from sluice.shard.frame import ShardContext, ShardSpec, Stopper, opening_delay_s, pending, read_shard_lines, unsent
from sluice.shard.parts import Checkpoint, PartWriter, load_checkpoint
from sluice.shard.sweep import Held, Timing, sweep_concurrency


class ShardRun:
    """One run of a shard: its checkpoint and number, writer and cache fill, budget and stopper, and
    the methods its runner calls to read, send, write what was not sent and finish.

    Opening it loads the shard's checkpoint and opens this run's writer, on `path` (the mode its
    outcomes are sent by), filling the cache when the job writes to it and `fills_cache`; `batch`:
    its budget is priced at the batch rate."""

    def __init__(
        self,
        ctx: ShardContext,
        spec: ShardSpec,
        *,
        path: str,
        item_rows_for_results: bool = True,
        fills_cache: bool = True,
        batch: bool = False,
        timing: Timing | None = None,
    ) -> None:
        self.ctx = ctx
        self.spec = spec
        self.timing = timing or Timing()
        self.checkpoint: Checkpoint = load_checkpoint(ctx.s3, spec)
        # this run's number: its parts are `part-<number>-<seq>`
        self.number = self.checkpoint.runs + 1
        self.fill = self._fill(path) if fills_cache else None
        self.writer = PartWriter(
            s3=ctx.s3,
            store=ctx.store,
            spec=spec,
            run=self.number,
            item_rows_for_results=item_rows_for_results,
            path=path,
            progress=ctx.progress,
            cache=self.fill,
        )
        self._batch = batch
        # the run's share of the job's spending cap (None: the job has none), for its first send
        self.budget = self.new_budget()
        self.stopper = Stopper(ctx, spec)
        # the shard's lines as the run reads them to send (`pending`), and those it handed out that
        # have no outcome yet (at most what the engine holds): what it did not send, once it stops
        self._lines: Iterator[Request] = iter(())
        self._open: dict[int, str] = {}

    @property
    def first(self) -> bool:
        """No earlier run of the shard wrote a part (Plan's cached part is run 0)."""
        return self.checkpoint.runs == 0

    async def opening(self) -> None:
        """The shard's first run waits its place in the first wave before its first request."""
        if self.first:
            await asyncio.sleep(opening_delay_s(self.spec))

    def new_budget(self) -> Budget | None:
        """A share of the job's spending cap, or None when the job has none."""
        spec = self.spec
        if not spec.budget_usd:
            return None
        return Budget(
            self.ctx.store,
            spec.job_id,
            usd_to_nano(spec.budget_usd),
            request_format=family(spec.provider),
            batch=self._batch,
            wait_s=min(HOLDERS_WAIT_S, self.ctx.settings.safety_margin_s),
            waiters=spec.running,
        )

    @property
    def out_of_budget(self) -> bool:
        return self.budget is not None and self.budget.exhausted

    def pending(self, skip: set[int] | None = None) -> Iterator[Request]:
        """The requests this run sends: the shard's lines without an outcome (`skip`, by default the
        checkpoint's), read once as the run sends them; invalid lines go to the writer as they pass."""
        done = self.checkpoint.done if skip is None else skip
        self._lines = pending(self.ctx.s3, self.spec, done, self.writer.add_invalid)
        return self._handed_out(self._lines)

    def _handed_out(self, lines: Iterator[Request]) -> Iterator[Request]:
        for request in lines:
            self._open[request.line] = request.custom_id
            yield request

    def filling(self, requests: Iterator[Request]) -> Iterator[Request]:
        """`requests` as the cache this run fills keys them (as they are, when it fills none)."""
        return self.fill.track(requests) if self.fill is not None else requests

    def left_to_send(self, skip: set[int] | None = None) -> int:
        """At most how many requests the run sends before retries: its lines without an outcome.
        The shared limit leases no more than that, so a run's last lease leaves nothing to give
        back at its end (a lease and a give-back a moment apart were two writes of the key's item
        for every run's end)."""
        done = self.checkpoint.done if skip is None else skip
        return max(0, self.spec.lines - self.spec.blank - len(done))

    def unsent(self, line: int, custom_id: str) -> LineError:
        """The error of a line the job's budget did not let the run send."""
        return unsent(self.spec, line, custom_id)

    async def write_unsent(self, error: Callable[[ShardSpec, int, str], LineError] | None = None) -> int:
        """Once the budget (or a refusing provider, as `error` makes them) stopped the run: each line
        it read to send and did not end, then each it had not read yet, to the writer as
        `budget_exceeded`. Returns how many.

        The rest of the shard is read on from where the run stopped, not again from its start: the
        invalid lines there go to the writer with their own codes as they pass."""
        return await asyncio.to_thread(self._write_unsent, error or unsent)

    def _write_unsent(self, error: Callable[[ShardSpec, int, str], LineError]) -> int:
        handed_out, self._open = self._open, {}
        count = 0
        for line, custom_id in sorted(handed_out.items()):
            self.writer.add_invalid(error(self.spec, line, custom_id))
            count += 1
        for request in self._lines:
            self.writer.add_invalid(error(self.spec, request.line, request.custom_id))
            count += 1
        return count

    async def finish(self, finished: bool, *, waiting: int = 0) -> None:
        """Write what the run still holds; a run that `finished` the shard assembles its outputs."""
        await self.writer.aflush(finished=finished, waiting=waiting)
        if finished:
            assemble(self.ctx.s3, self.spec)

    async def send(
        self,
        requests: Iterable[Request],
        sink: Callable[[Outcome], None],
        *,
        expected: int | None = None,
        budget: Budget | None = None,
        sweep: bool = False,
        check_answers: bool = False,
    ) -> EngineStats:
        """Send `requests`, each outcome to `sink`, until the Lambda's time is nearly up, the job is
        stopped or the `budget` is spent; `expected`: at most how many there are, when the caller
        knows. With `sweep`, the lines whose first attempts ran out on transient failures get the
        last sweep's rounds, and a send given up mid-flight (an interrupted local run) checkpoints
        what was answered first, as a run that stops early would. `check_answers`: judge every
        answer by the job's checks, whatever the mode. However it ends, the budget's pool goes back.

        Each send reads the job's stop mark as it starts (`Stopper`)."""
        self.stopper = Stopper(self.ctx, self.spec)
        handed_out = self._open

        def ended(outcome: Outcome) -> None:
            handed_out.pop(outcome.line, None)
            sink(outcome)

        try:
            if sweep:
                return await self._sweep(requests, ended, budget, expected)
            concurrency, attempts = self.spec.concurrency, self.spec.max_attempts
            return await self._pass(requests, ended, concurrency, attempts, budget, expected, check_answers, None)
        except asyncio.CancelledError:
            if sweep:
                await self.writer.aflush(finished=False)
            raise
        finally:
            if budget is not None:
                await asyncio.to_thread(budget.close)

    async def _sweep(
        self, requests: Iterable[Request], sink: Callable[[Outcome], None], budget: Budget | None, expected: int | None
    ) -> EngineStats:
        """The first pass, then the last sweep's rounds over the lines that failed transiently
        (`sweep`). Once the budget is spent, a held line keeps the outcome it had. The stats are the
        first pass's; `stopped_early` is also true when a round ran out of time before taking every
        held line (the rest are pending for the next run)."""
        spec, stopper, timing = self.spec, self.stopper, self.timing
        cap = spec.max_attempts
        given = first_pass_attempts(cap)
        held = Held(sink, sweeps=sweep_round_attempts(given, cap, LINE_ATTEMPTS_CEILING) > 0, first_pass=given)
        # one watch for every pass: a 5xx on every attempt is a refusal once it lasts (`refusal`)
        answers = self.fail_fast_after
        refusals = RefusalWatch(answers, family(spec.provider)) if answers else None
        stats = await self._pass(
            held.tracked(requests), held.hold_or_pass, spec.concurrency, given, budget, expected, False, refusals
        )
        held.in_flight.clear()

        def over() -> bool:
            return stopper.stopped is not None or stats.refused is not None or (budget is not None and budget.exhausted)

        if not held.lines or (stats.stopped_early and not over()):
            # out of time: what it holds is pending for the next run
            return stats
        if over():
            # the first pass's figures stand: what it left unsent is the caller's to write
            held.end(_stopped(stopper, stats, budget))
            return stats
        concurrency = sweep_concurrency(spec.concurrency)
        pause = RetryPolicy(base_delay_s=self.ctx.settings.retry_base_delay_s)
        started = timing.clock()
        rounds = 0
        while held.lines:
            if over():
                # the job was cancelled or has failed, the provider refused the run (`refusal`: a 5xx
                # on every attempt), or its budget is spent: what these lines last got is their outcome
                held.end(_stopped(stopper, stats, budget))
                break
            late = rounds > 0 and sweep.late(started, timing.clock())
            # a deadline job's shard sending directly what its batch left: the deadline comes first
            cutover = rounds > 0 and spec.cutover_at is not None and timing.wall() >= spec.cutover_at
            attempts = sweep_round_attempts(given, cap, line_attempts(held.faults.failed, held.faults.attempts))
            if late or cutover or not attempts:
                held.end(held.no_more(cap, late, cutover))
                break
            if rounds:
                # longer each round, so a provider still recovering gets the time; not a line's own next
                # backoff (16 s after six attempts), which a line merely unlucky would wait for nothing
                await timing.sleep(backoff_s(rounds, pause, timing.rand))
            again = held.again()
            last = await self._pass(again, held.swept, concurrency, attempts, budget, len(again), False, refusals)
            given += attempts
            rounds += 1
            if last.refused is not None:
                # still failing every attempt: the lines not swept yet keep what they last got
                stats.refused, stats.given_up = last.refused, last.given_up
            elif last.stopped_early and not over():
                break
        stats.stopped_early = bool(held.lines)
        stats.remaining = len(held.lines)
        return stats

    @property
    def fail_fast_after(self) -> int:
        """How many answers alike stop a shard's run as a refusing provider's (`sluice.send.refusal`):
        a direct shard's; 0 for the others, whose responses and batch rows are answered later, not in
        the order they were sent."""
        return REFUSAL_ANSWERS if self.spec.mode == Mode.DIRECT else 0

    async def _pass(
        self,
        requests: Iterable[Request],
        sink: Callable[[Outcome], None],
        concurrency: int,
        max_attempts: int,
        budget: Budget | None,
        expected: int | None,
        check_answers: bool,
        refusals: RefusalWatch | None,
    ) -> EngineStats:
        """One pass of the engine over `requests`, at `concurrency` and up to `max_attempts` a line.

        With the shared limit on, every attempt draws from the key-wide bucket and also keeps to the
        shard's part of the job's own rate limits: a job never exceeds its `sluice-rpm`, and never
        takes more than its fair share of the key. What the pass leased and did not spend goes back
        when it ends, however it ends."""
        ctx, spec = self.ctx, self.spec
        settings = ctx.settings
        shared = None
        if settings.shared_limit == "on":
            shared = SharedLimit(
                BucketTable(ctx.store.table),
                base_url=settings.provider_base_url,
                api_key=ctx.api_key,
                lessee=f"{spec.job_id}#{spec.shard}",
                request_format=family(spec.provider),
                seeds=parse_rate_limits(settings.rate_limits),
                default_seed=RateSeed(spec.job_rpm, spec.job_tpm) if spec.job_rpm else None,
                expected=expected,
            )
        engine = EngineSettings(
            concurrency=concurrency,
            policy=RetryPolicy(
                max_attempts=unswept_attempts(max_attempts),
                request_timeout_s=settings.request_timeout_s,
                base_delay_s=settings.retry_base_delay_s,
            ),
            rpm=spec.rpm,
            tpm=spec.tpm,
            fail_fast_after=self.fail_fast_after,
            request_format=family(spec.provider),
            # a direct shard's answers, and those of a batch shard's direct pass (what its batches left
            # or answered invalid); a background shard's arrive by poll, and only its sends again are
            # checked here
            output_check=(
                OutputCheck.for_spec(spec) if check_answers or spec.mode in (Mode.DIRECT, Mode.BATCH) else None
            ),
            base_url=settings.provider_base_url,
            api_key=ctx.api_key,
            sign=ctx.sign,
            should_stop=self.stopper,
            count_remaining=False,
            shared=shared,
            budget=budget,
            refusals=refusals,
            # an answer arriving after the Lambda's end is lost with it
            time_left=lambda: ctx.remaining_s() - settings.safety_margin_s,
        )
        try:
            async with ctx.session_factory(concurrency) as session:
                return await fan_out(requests, session=session, settings=engine, sink=sink)
        finally:
            if shared is not None:
                await shared.close()

    def _fill(self, path: str) -> CacheFill | None:
        """The cache the run's writer fills, when its job writes to the cache."""
        ctx, spec = self.ctx, self.spec
        if not spec.fills_cache:
            return None

        def keys_for() -> Iterator[Request]:
            return (item for item in read_shard_lines(ctx.s3, spec) if isinstance(item, Request))

        return CacheFill(
            cache_store(ctx.s3, ctx.settings),
            base_url=ctx.settings.cache_provider_name,
            name=segment_name(spec.job_id, spec.shard, self.number, path),
            request_format=family(spec.provider),
            keep_incomplete=spec.cache_incomplete,
            keys_for=keys_for,
            # `read_shard_lines` sorted the bodies' keys, as it does for every job that fills the cache
            canonical=True,
        )


def _stopped(stopper: Stopper, stats: EngineStats, budget: Budget | None) -> str:
    if stats.refused is not None:
        return "the provider refused the run"
    if budget is not None and budget.exhausted:
        return "the job's budget is spent"
    return f"the job is {(stopper.stopped or 'stopped').lower()}"
