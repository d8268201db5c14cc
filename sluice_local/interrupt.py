"""Signals during `sluice run`: Ctrl-C, SIGTERM and SIGHUP end the job as `sluice cancel` ends
a deployed one, and the outputs hold every answer the provider gave.

What finished is kept, no new line is sent, and every other line goes to the errors as
`cancelled`. After Ctrl-C the requests in flight get a short grace to be answered: the provider
is paying for them. A second signal, or the end of the grace, gives up the ones still in flight
(their answers would arrive after the outputs, so none is kept anywhere) and the shards
checkpoint what they were answered, so the results hold exactly the answers the response cache
holds. SIGTERM and SIGHUP come from a supervisor (`timeout`, a CI cancel, a closed terminal)
that will not wait: they skip the grace. Then open work at the provider (background responses,
batches) is cancelled, which a signal skips, and the outputs are written, which no signal
interrupts. The exit code is 128 + the first signal's number: 130, 143, 129.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from sluice.contract import ExecutionStatus

from sluice_local.console import say

# how long a Ctrl-C waits for the requests in flight, at most (and never past their timeout)
DRAIN_GRACE_S = 10.0
# how long the shards get to checkpoint once their requests in flight are given up
ABANDON_WAIT_S = 30.0
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A signal that stops `sluice run`; a KeyboardInterrupt, so what catches Ctrl-C catches it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Signals:
    """The handlers of SIGINT, SIGTERM and SIGHUP while `sluice run` runs.

    Until the job starts, a signal raises `Interrupted` at once: nothing was sent. Once it runs,
    a signal is only recorded (an exception raised at any point of the local cloud's work could
    leave it half done): the run looks at `received` where it can stop, and from the second
    signal on each one is answered with the note of what the run is doing (`doing`).
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self._raise = True
        self._note = ""
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in SIGNALS:
            # a signal the caller ignores stays ignored: `nohup` ignores SIGHUP, and a shell
            # script's `sluice run … &` SIGINT, so that they outlive the terminal or its Ctrl-C
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        if self._raise:
            raise Interrupted(signum)
        if len(self.received) > 1 and self._note:
            _tell(self._note)

    def job_started(self) -> None:
        """From now on a signal is recorded, and the run stops at its next look (`check`)."""
        self._raise = False

    def check(self) -> None:
        """Raise `Interrupted` for the first signal, if one came."""
        if self.received:
            raise Interrupted(self.received[0])

    def doing(self, note: str) -> None:
        """What a further signal is told (and, from `Signals.since`, what it does)."""
        self._note = note

    def since(self, count: int) -> Callable[[], bool]:
        """Whether a signal came after the first `count`."""
        return lambda: len(self.received) > count


def _tell(text: str) -> None:
    # a hang-up may have closed the terminal: saying so must not stop the outputs being written
    with contextlib.suppress(OSError):
        say(text)


def stop_run(cloud: Any, job_id: str, execution: str, base_url: str, api_key: str, signals: Signals) -> dict[str, Any]:
    """Stop the job after the first signal and write its outputs; returns the execution as it ended."""
    signum = signals.received[0]
    name = signal.Signals(signum).name
    cloud.stop_sending(stop=lambda: _stop(execution))
    grace = min(DRAIN_GRACE_S, float(cloud.settings.request_timeout_s))
    if signum == signal.SIGINT:
        _tell(
            f"\ncancelling: no new line is sent; the requests in flight get up to {grace:g} s to be answered "
            "(Ctrl-C again stops waiting; every answer so far is kept either way)"
        )
        signals.doing("stopping the wait: the requests still in flight are given up")
        cloud.wait_for_runs(grace, until=signals.since(1))
    else:
        _tell(f"\n{name}: stopping the job; the requests in flight are given up, every answer so far is kept")
    signals.doing(writing_note())
    left = cloud.abandon(ABANDON_WAIT_S)
    if left:
        _tell(f"{left} shard run(s) did not stop within {ABANDON_WAIT_S:g} s: their lines are in the errors")
    # the local cloud's Bedrock batch jobs, stopped as the user (its admin) would stop them
    jobs = getattr(cloud, "bedrock_jobs", None)
    _cancel_at_provider(job_id, base_url, api_key, signals, bedrock=jobs.client if jobs is not None else None)
    signals.doing(writing_note())
    _tell("writing the outputs…")
    _cancel(job_id, execution, reason=f"interrupted ({'Ctrl-C' if signum == signal.SIGINT else name})")
    return dict(_admin_runtime().sfn.describe_execution(executionArn=execution))


def writing_note() -> str:
    """What a signal gets while the outputs are written, which nothing should cut short."""
    return (
        "still writing the outputs with every answer so far; this cannot be skipped "
        f"(`kill -9 {os.getpid()}` stops at once: the response cache keeps the answers, a run again sends the rest)"
    )


def _admin_runtime() -> Any:
    import boto3
    from sluice_handlers.runtime import Runtime

    # the user cancels, with the local cloud's admin credentials, as `sluice cancel` would with theirs
    return Runtime.from_session(boto3.Session())


def _stop(execution: str) -> None:
    """No step starts any more, so no shard run begins again while the ones running stop."""
    sfn = _admin_runtime().sfn
    if sfn.describe_execution(executionArn=execution)["status"] == ExecutionStatus.RUNNING:
        sfn.stop_execution(executionArn=execution, error="Sluice.Cancelled", cause="interrupted")


def _cancel_at_provider(
    job_id: str, base_url: str, api_key: str, signals: Signals, *, bedrock: Callable[[], Any] | None = None
) -> None:
    """Cancel the background responses and batches still open, so the provider does not bill
    for work nobody will collect. A signal stops waiting for it: what is not cancelled yet may
    still run."""
    import asyncio

    from sluice.runners.cancel import cancel_at_provider, open_provider_work

    runtime = _admin_runtime()
    work = open_provider_work(runtime.store, job_id)
    if not work:
        return
    count = len(work.batches) + len(work.responses)
    _tell(f"cancelling {count:,} open batch(es) or response(s) at the provider… (Ctrl-C again skips it)")
    signals.doing("skipping the provider's cancels")
    answers: list[Any] = []
    worker = threading.Thread(
        target=lambda: answers.append(
            asyncio.run(
                cancel_at_provider(
                    work,
                    base_url=base_url,
                    api_key=api_key,
                    provider=runtime.settings.provider,
                    s3=runtime.s3,
                    bedrock=bedrock,
                )
            )
        ),
        name="provider-cancels",
        daemon=True,
    )
    worker.start()
    skip = signals.since(len(signals.received))
    while worker.is_alive() and not skip():
        worker.join(0.1)
    if not answers:
        _tell(f"left open at the provider: up to {count:,} batch(es) or response(s); they may still run and be billed")
        return
    refused = answers[0].failures
    if refused:
        _tell(f"the provider refused {len(refused):,} of {count:,} cancels: they may still run and be billed")


def _cancel(job_id: str, execution: str, *, reason: str) -> None:
    """End the job CANCELLED: what finished in the results, every other line in the errors."""
    from sluice.runners.cancel import JobNotFound, cancel_job

    rt = _admin_runtime()
    try:
        cancel_job(
            s3=rt.s3,
            store=rt.store,
            sfn=rt.sfn,
            job_id=job_id,
            provider=lambda: ("", ""),
            reason=reason,
            provider_cancels=False,
        )
    except JobNotFound:
        # interrupted before Plan made the job: nothing ran, so there is nothing to keep
        if rt.sfn.describe_execution(executionArn=execution)["status"] == ExecutionStatus.RUNNING:
            rt.sfn.stop_execution(executionArn=execution, error="Sluice.Cancelled", cause="interrupted")
