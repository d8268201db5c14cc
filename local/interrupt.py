"""Ctrl-C during `sluice run`: cancel the job the way `sluice cancel` does a deployed one.

What finished is kept, open provider work is cancelled, the rest goes to the errors as
`cancelled`. Before the outputs are written the shards stop taking lines and the requests
in flight are given a short grace to be answered: the provider is paying for them, so their
answers go to the results and the response cache, and a run again does not send them twice.
A second Ctrl-C skips that wait and what is left of cancelling at the provider, but the
outputs are still written; only a third quits without them.
"""

from __future__ import annotations

import signal
from typing import Any

from local.console import say

# how long a Ctrl-C waits for the requests in flight, at most (and never past their timeout)
DRAIN_GRACE_S = 10.0


class CtrlC:
    """The SIGINT handler from the first Ctrl-C on; `restore` puts the previous one back."""

    def __init__(self) -> None:
        self.presses = 0
        self.cancelling_at_provider = False
        self._previous: Any = None

    def first(self) -> None:
        self.presses = 1
        self.cancelling_at_provider = True
        self._previous = signal.signal(signal.SIGINT, self._again)

    def _again(self, signum: int, frame: Any) -> None:
        self.presses += 1
        if self.presses == 2 and not self.cancelling_at_provider:
            say("\nstill writing what finished (Ctrl-C again quits without it)")
            return
        raise KeyboardInterrupt

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def cancel_run(cloud: Any, job_id: str, execution: str, base_url: str, api_key: str, ctrl_c: CtrlC) -> dict[str, Any]:
    """Cancel after the first Ctrl-C; returns the execution as it ended."""
    try:
        say("\ncancelling: stopping the job and cancelling open work at the provider… (Ctrl-C again skips that)")
        grace = min(DRAIN_GRACE_S, float(cloud.settings.request_timeout_s))
        left = cloud.drain(grace, stop=lambda: _stop(execution))
        if left:
            say(
                f"{left} shard run(s) still waiting for the provider after {grace:g} s: "
                "what they get now goes to the response cache only"
            )
        _cancel(job_id, execution, base_url, api_key, at_provider=True)
        ctrl_c.cancelling_at_provider = False
        return dict(cloud.wait(execution, timeout_s=30))
    except (KeyboardInterrupt, TimeoutError):
        ctrl_c.cancelling_at_provider = False
        say("\nwriting what finished, without cancelling at the provider (Ctrl-C again quits without writing)")
        _cancel(job_id, execution, base_url, api_key, at_provider=False)
        return dict(_admin_runtime().sfn.describe_execution(executionArn=execution))


def _admin_runtime() -> Any:
    import boto3
    from handlers.runtime import Runtime

    # the user cancels, with the local cloud's admin credentials, as `sluice cancel` would with theirs
    return Runtime.from_session(boto3.Session())


def _stop(execution: str) -> None:
    """No step starts any more, so no shard run begins again while the ones running drain."""
    sfn = _admin_runtime().sfn
    if sfn.describe_execution(executionArn=execution)["status"] == "RUNNING":
        sfn.stop_execution(executionArn=execution, error="Sluice.Cancelled", cause="interrupted")


def _cancel(job_id: str, execution: str, base_url: str, api_key: str, *, at_provider: bool) -> None:
    from sluice.cancel import JobNotFound, cancel_job

    rt = _admin_runtime()
    try:
        report = cancel_job(
            s3=rt.s3,
            store=rt.store,
            sfn=rt.sfn,
            job_id=job_id,
            provider=lambda: (base_url, api_key),
            provider_cancels=at_provider,
        )
    except JobNotFound:
        # interrupted before Plan made the job: nothing ran, so there is nothing to keep
        if rt.sfn.describe_execution(executionArn=execution)["status"] == "RUNNING":
            rt.sfn.stop_execution(executionArn=execution, error="Sluice.Cancelled", cause="interrupted")
        return
    if report.left_open:
        say(f"left open at the provider: {report.left_open} batch(es) or response(s); they may still run and be billed")
