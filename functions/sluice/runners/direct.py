"""Direct mode: every line is one HTTP request through the engine, answered while the shard runs.

A run sends what has no terminal result yet and checkpoints outcomes as parts (the lines
that failed transiently last, after one more pass: `sweep`); a run that ends short of the
shard (the Lambda's time is nearly up) is followed by another, and the last one assembles
the shard's files.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace

from sluice.contract import DirectRun, Mode, ProviderRefused, parse_validate
from sluice.contract.model import ErrorCode, Request
from sluice.formats.lines import LineError
from sluice.runners.batch.cutover import handed_over
from sluice.send.refusal import unsent_message, write_refusal
from sluice.shard.frame import ShardContext, ShardSpec, margin_s
from sluice.shard.parts import turned_down
from sluice.shard.run import ShardRun


class ShardStalled(RuntimeError):
    """A run ended before sending anything: the Lambda timeout leaves no room for a request."""


async def run_direct(ctx: ShardContext, spec: ShardSpec) -> DirectRun:
    started = time.monotonic()
    # a late batch shard sends what its batch left at the rate the other shards handed it
    spec = handed_over(spec, time.time())
    run = ShardRun(ctx, spec, path=Mode.DIRECT, item_rows_for_results=False)
    await run.opening()
    source = run.pending()
    if spec.mode == Mode.BATCH and parse_validate(spec.validate):
        source = _carrying(source, await asyncio.to_thread(turned_down, ctx.s3, spec))
    requests = run.filling(source)
    stats = await run.send(requests, run.writer.add_outcome, expected=run.left_to_send(), budget=run.budget, sweep=True)
    stopped = run.stopper.stopped
    out_of_budget = run.out_of_budget and not stopped
    refused = stats.refused if not stopped and not out_of_budget else None
    if out_of_budget:
        await run.write_unsent()
    elif refused is not None:
        await _write_refused(run, refused, stats.given_up)
    finished = not stats.stopped_early or out_of_budget or refused is not None
    if stopped:
        await run.finish(False)
        return DirectRun(done=False, cancelled=True, run=run.number, sent=run.writer.done + run.writer.failed)
    if not finished and stats.sent == 0:
        raise ShardStalled(
            f"shard {spec.shard} stopped before sending anything: {ctx.remaining_s():.0f} s left is under the "
            f"request timeout plus safety margin ({margin_s(ctx):.0f} s)"
        )
    await run.finish(finished)
    return DirectRun(
        done=finished,
        run=run.number,
        sent=run.writer.done + run.writer.failed,
        seconds=round(time.monotonic() - started, 3),
    )


def _carrying(source: Iterator[Request], turned: dict[int, str]) -> Iterator[Request]:
    """A batch shard's direct pass: each line its batches answered invalid carries the check that
    answer failed, so the line's sends go on from it (counted repaired when it then passes)."""
    for request in source:
        check = turned.get(request.line)
        yield request if check is None else replace(request, failed_checks=(check,))


async def _write_refused(run: ShardRun, refused: ProviderRefused, given_up: int = 0) -> None:
    """The lines a refusing provider kept from being sent, as errors carrying its error, and the
    note Merge puts in the summary (counting the `given_up` lines too: those in flight)."""

    def error(spec: ShardSpec, line: int, custom_id: str) -> LineError:
        return LineError(line, ErrorCode.PROVIDER_REFUSED, f"line {line}: {unsent_message(refused)}", custom_id)

    lines = await run.write_unsent(error)
    # with those in flight it gave up (already ended, as `provider_refused`)
    spec = run.spec
    await asyncio.to_thread(
        write_refusal, run.ctx.s3, spec.bucket, spec.refusal_key, replace(refused, lines=lines + given_up)
    )
