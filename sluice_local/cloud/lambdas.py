"""The Lambda runtime as the handlers meet it in the local cloud: the context object, the errors
Lambda reports for a function it stopped, and each invocation as the cloud records it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from sluice.contract import Settings, WebhookSettings, variables_read
from sluice.providers import Signer
from sluice.send.engine import make_session
from sluice.shard.frame import LocalDeps
from sluice.shard.progress import ProgressSink

from sluice_local import quotas

# every variable that carries a setting of some function
SETTINGS_VARIABLES = Settings.variables() | WebhookSettings.variables()


class LambdaTimeout(Exception):
    """Raised by tests to play a Lambda killed at its timeout, mid-run."""


class LambdaOutOfMemory(Exception):
    """The function used more memory than configured: Lambda stops it and reports this."""


class RunInterrupted(Exception):
    """A provider step asked to start after `sluice run` was interrupted: it sends nothing."""


def lambda_error(exc: Exception) -> dict[str, str]:
    """The shape Lambda gives Step Functions for an unhandled error, or for a timeout."""
    kind = "Sandbox.Timedout" if isinstance(exc, LambdaTimeout) else type(exc).__name__
    if isinstance(exc, LambdaOutOfMemory):
        kind = "Runtime.OutOfMemory"
    if isinstance(exc, quotas.QuotaExceeded):
        kind = "Function.ResponseSizeTooLarge" if "response" in str(exc) else "RequestTooLargeException"
    return {"errorType": kind, "errorMessage": str(exc)}


def step_environment(function: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the function is given of `env` (the process's), as infra gives the deployed one: all
    but the variables of settings sets it does not read (`sluice.contract.step_settings`)."""
    read = variables_read(function)
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k in read or k not in SETTINGS_VARIABLES}


class LambdaContext:
    """The parts of the Lambda context object the handlers use, and what only the local cloud gives
    a function (`local`): the progress sink, the sessions a shard sends through (`session_factory`),
    which an interrupted run abandons, the step's `bedrock` client and signer."""

    def __init__(
        self,
        name: str,
        timeout_s: float,
        progress: ProgressSink | None = None,
        *,
        bedrock: Callable[[], Any] | None = None,
        sign: Signer | None = None,
    ) -> None:
        self.function_name = name
        self.aws_request_id = f"local-{time.monotonic_ns()}"
        self._deadline = time.monotonic() + timeout_s
        # `bedrock`: the client the step's Bedrock Batch API uses (`sluice_local.cloud.bedrock_jobs`);
        # `sign`: how the step signs Bedrock requests, when not with its role's credentials
        # (`sluice_local.bedrock_endpoint`)
        self.local = LocalDeps(session_factory=self.session_factory, progress=progress, bedrock=bedrock, sign=sign)
        # the function's own variables, as deployed (`LocalCloud.step_environment`); None: the process's
        self.environment: Mapping[str, str] | None = None
        self._lock = threading.Lock()
        # the loop and task sending through a session now, while its session is open
        self._sending: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))

    def end_now(self) -> None:
        """As if the timeout were here: a shard takes no new line, lets those in flight finish and checkpoints."""
        self._deadline = time.monotonic()

    @asynccontextmanager
    async def session_factory(self, concurrency: int) -> AsyncIterator[Any]:
        """The shard's HTTP session (`sluice.send.engine.make_session`); while it is open, `abandon`
        can cut the task sending through it short."""
        task = asyncio.current_task()
        sending = (asyncio.get_running_loop(), task) if task is not None else None
        with self._lock:
            self._sending = sending
        try:
            async with make_session(concurrency) as session:
                yield session
        finally:
            with self._lock:
                self._sending = None

    def abandon(self) -> None:
        """Cancel the task sending now, if one is: the requests in flight get no answer, and the
        shard checkpoints what it was answered before it ends (`sluice.runners.direct.run_direct`)."""
        with self._lock:
            sending = self._sending
        if sending is None:
            return
        loop, task = sending

        def cancel() -> None:
            # on the loop's own thread: only while that task still sends, never in what follows
            if self._sending is sending:
                task.cancel()

        with contextlib.suppress(RuntimeError):  # its loop has closed: the run has ended
            loop.call_soon_threadsafe(cancel)


@dataclass
class Invocation:
    step: str
    seconds: float
    error: str | None
    ended_at: float = field(default_factory=time.time)
    payload: dict[str, Any] = field(default_factory=dict)
