"""`sluice.run` and `sluice.arun`: a job on this machine, through `sluice run`'s own code (the local
cloud, the same state machine and Lambda code), handed back as a `Job`."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Mapping
from typing import Any

from sluice_local.api.errors import ProviderError, UsageError, as_sluice_errors
from sluice_local.api.jobs import Job, JobInterrupted
from sluice_local.api.options import Source, input_file, parse
from sluice_local.cli.run import Ended, run_job
from sluice_local.console import EXIT_PROVIDER, EXIT_USAGE
from sluice_local.interrupt import Signals
from sluice_local.run_end import refusal_lines


def run(source: Source, /, *, name: str = "requests", **options: Any) -> Job:
    """Run `source` (a JSONL path, or request dicts) as `sluice run` would, blocking until the job
    ends; Ctrl-C cancels it and raises `JobInterrupted` once its outputs are written."""
    signals = Signals()
    if threading.current_thread() is threading.main_thread():
        signals.install()
    try:
        return finished(_ended(source, name, options, signals))
    finally:
        signals.restore()


async def arun(source: Source, /, *, name: str = "requests", **options: Any) -> Job:
    """`run` for code in an event loop: the job runs on a worker thread. Cancelling the awaiting
    task, or Ctrl-C, cancels the job; the outputs are written before it is re-raised."""
    signals = Signals()
    # the job's wait looks at the signals, never the loop: a signal is recorded from the start
    signals.job_started()
    if threading.current_thread() is threading.main_thread():
        signals.install()
    # the thread hands back how the job ended, never a KeyboardInterrupt, which asyncio would take for the loop's own
    worker = asyncio.ensure_future(asyncio.to_thread(_ended, source, name, options, signals))
    try:
        ended = await asyncio.shield(worker)
    except asyncio.CancelledError:
        signals.received.append(signal.SIGINT)
        # the job ends CANCELLED with what it was answered; the caller's cancel goes on after that
        await worker
        raise
    finally:
        signals.restore()
    return finished(ended)


def _ended(source: Source, name: str, options: Mapping[str, Any], signals: Signals) -> Ended:
    options = {"quiet": True, **options}
    with as_sluice_errors(), input_file(source, name=name) as path:
        args = parse("run", [str(path)], options)
        return run_job(args, signals)


def finished(ended: Ended) -> Job:
    """The job, or what the command would exit non-zero for: Ctrl-C, a provider's refusal, Plan's."""
    job = job_of(ended)
    if ended.interrupted is not None:
        raise JobInterrupted(job)
    if ended.code == EXIT_PROVIDER:
        raise ProviderError("\n".join(refusal_lines(ended.summary)) or str(ended.summary.get("error")), job=job)
    if ended.code == EXIT_USAGE:
        raise UsageError(str(ended.summary.get("error") or "Plan refused the job's options"), job=job)
    return job


def job_of(ended: Ended) -> Job:
    written = ended.written
    return Job(
        job_id=ended.job_id,
        status=ended.status,
        summary=ended.summary,
        results_path=written.get("results"),
        errors_path=written.get("errors"),
        summary_path=written.get("summary"),
        report_path=ended.report,
    )
