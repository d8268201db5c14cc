"""Clients and settings, built once per function on its first invocation (never at import).

Each function's clients come from its own AWS session. In Lambda that is the default session:
the runtime's credentials are the function's role, and a container runs one function. The local
cloud runs every function in one process, several at once in threads, so it hands each function
its own role's session through `use_sessions` instead.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from sluice.contract import Settings
from sluice.engine import make_session
from sluice.shard import ShardContext
from sluice.store import JobStore

SessionFor = Callable[[str], boto3.Session]


def _default_session(function_name: str) -> boto3.Session:
    return boto3.Session()


_session_for: SessionFor = _default_session
_runtimes: dict[str, Runtime] = {}
_lock = threading.Lock()


def use_sessions(session_for: SessionFor | None) -> None:
    """Where each function's session comes from, by function name; None for the default session.
    Forgets the runtimes built so far, which hold the previous sessions' clients."""
    global _session_for
    with _lock:
        _session_for = session_for or _default_session
        _runtimes.clear()


def session_for(function_name: str) -> boto3.Session:
    return _session_for(function_name)


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    s3: Any
    events: Any
    store: JobStore
    secrets: Any
    sfn: Any

    @classmethod
    def from_session(cls, session: boto3.Session) -> Runtime:
        settings = Settings.from_env()
        return cls(
            settings=settings,
            s3=session.client("s3"),
            events=session.client("events"),
            store=JobStore(session.resource("dynamodb").Table(settings.table), ttl_days=settings.ttl_days),
            secrets=session.client("secretsmanager"),
            sfn=session.client("stepfunctions"),
        )

    @functools.cached_property
    def api_key(self) -> str:
        # read at first use and kept for the container's life; never logged or passed on
        value = self.secrets.get_secret_value(SecretId=self.settings.api_key_secret_arn)
        secret = value.get("SecretString") or ""
        # the stack creates the secret with a placeholder: better one clear failure than a 401 per line
        if not secret or secret.startswith("PLACEHOLDER"):
            raise RuntimeError(
                "the provider API key secret is not set; set it with `aws secretsmanager put-secret-value`"
            )
        return str(secret)

    def shard_context(self, context: Any) -> ShardContext:
        return ShardContext(
            s3=self.s3,
            store=self.store,
            settings=self.settings,
            api_key=self.api_key,
            remaining_s=lambda: context.get_remaining_time_in_millis() / 1000.0,
            session_factory=make_session,
            # only the local cloud's context carries one: it draws `sluice run`'s live progress
            progress=getattr(context, "progress", None),
        )


def runtime(context: Any) -> Runtime:
    """The runtime of the function that `context` (the Lambda context) belongs to."""
    name = str(context.function_name)
    # Creating clients from one session in several threads at once is not safe in botocore;
    # the local cloud's Map children start the same function concurrently.
    with _lock:
        built = _runtimes.get(name)
        if built is None:
            built = _runtimes[name] = Runtime.from_session(_session_for(name))
        return built
