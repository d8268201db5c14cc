"""Clients and settings, built once per function on its first invocation (never at import).

A function's settings are the sets its step declares (`sluice.contract.step_settings.READS`), read
from its environment: in Lambda the process's; in the local cloud the context's `environment`,
which holds only those sets' variables, as infra gives the deployed function.

Each function's clients come from its own AWS session. In Lambda that is the default session:
the runtime's credentials are the function's role, and a container runs one function. The local
cloud runs every function in one process, several at once in threads, so it hands each function
its own role's session through `use_sessions` instead.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import boto3
from aws_lambda_powertools.utilities.parameters import SecretsProvider
from sluice.contract import READS, Mode, Provider, Settings, SettingsSet, causes
from sluice.providers import Signer, apis, modes, signing
from sluice.send.engine import make_session
from sluice.shard.frame import DEPLOYED, LocalDeps, ShardContext
from sluice.store.jobs import JobStore

SessionFor = Callable[[str], boto3.Session]

# Secrets are set (and rotated) with put-secret-value after the stack exists; a warm container
# picks up a new value within this long instead of using the old one until it is recycled.
SECRET_MAX_AGE_S = 300
# when each provider (by id) last read each secret: what tells a cache miss from a hit
_read_at: dict[tuple[int, str], float] = {}


def read_secret(secrets: SecretsProvider, arn: str, *, max_age: int = SECRET_MAX_AGE_S) -> str:
    """A secret's value through Powertools' cache (one GetSecretValue per `max_age`); never
    logged or passed on. The provider is built on the function's own client, so the call is
    made with the function's role."""
    now = time.monotonic()
    due = now - _read_at.get((id(secrets), arn), -math.inf) >= max_age
    # only a read that misses the cache calls Secrets Manager: a cold run's, or one every max_age
    with causes.because(causes.SECRET) if due else contextlib.nullcontext():
        value = secrets.get(arn, max_age=max_age)
    if due:
        _read_at[(id(secrets), arn)] = now
    return value.decode() if isinstance(value, bytes) else str(value)


def local_deps(context: Any) -> LocalDeps:
    """The local cloud's dependencies that `context` carries; none on a deployed Lambda's context."""
    local = getattr(context, "local", None)
    return local if isinstance(local, LocalDeps) else DEPLOYED


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
    secrets: SecretsProvider
    sfn: Any
    # a family that signs each request with the function's credentials has no key to read (`signing`)
    sign: Signer | None = None
    # the function's session: Bedrock's clients are made from it, only by `sluice.providers`
    session: boto3.Session | None = None

    @classmethod
    def from_session(
        cls,
        session: boto3.Session,
        sets: Iterable[type[SettingsSet]] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Runtime:
        """The runtime of a function that reads the settings `sets` (None: every one) from `env`."""
        env = os.environ if env is None else env
        sets = None if sets is None else tuple(sets)
        settings = Settings.from_env(env) if sets is None else Settings.reading(sets, env)
        reads_provider = sets is None or Provider in sets
        signed = signing.signed(settings.provider, session, env) if reads_provider else None
        if signed is not None:
            settings = settings.but(provider_base_url=signed[0])
        return cls(
            settings=settings,
            s3=session.client("s3"),
            events=session.client("events"),
            store=JobStore(session.resource("dynamodb").Table(settings.table), ttl_days=settings.ttl_days),
            secrets=SecretsProvider(boto3_client=session.client("secretsmanager")),
            sfn=session.client("stepfunctions"),
            sign=signed[1] if signed is not None else None,
            session=session,
        )

    @property
    def api_key(self) -> str:
        if self.sign is not None:
            return ""
        secret = read_secret(self.secrets, self.settings.api_key_secret_arn)
        # the stack creates the secret with a placeholder: better one clear failure than a 401 per line
        if not secret or secret.startswith("PLACEHOLDER"):
            raise RuntimeError(
                "the provider API key secret is not set; set it with `aws secretsmanager put-secret-value`"
            )
        return secret

    def shard_context(self, context: Any, local: LocalDeps) -> ShardContext:
        """A shard's context in the function `context` runs, with what the local cloud gives it (`local`)."""
        api_key = self.api_key
        offered = modes(self.settings.provider)
        return ShardContext(
            s3=self.s3,
            store=self.store,
            settings=self.settings,
            api_key=api_key,
            remaining_s=lambda: context.get_remaining_time_in_millis() / 1000.0,
            session_factory=local.session_factory or make_session,
            progress=local.progress,
            # a family without a Batch API or background responses gets none: Plan never runs those modes for it
            batch_api=apis.batch_api_for(
                self.settings,
                api_key,
                s3=self.s3,
                bedrock=local.bedrock or apis.bedrock_clients(self.session),
            )
            if Mode.BATCH in offered
            else None,
            background_api=apis.background_api(self.settings.provider) if Mode.BACKGROUND in offered else None,
            sign=local.sign or self.sign,
        )


def runtime(context: Any, step: str) -> Runtime:
    """The runtime of the function of `step` that `context` (the Lambda context) belongs to."""
    name = str(context.function_name)
    # Creating clients from one session in several threads at once is not safe in botocore;
    # the local cloud's Map children start the same function concurrently.
    with _lock:
        built = _runtimes.get(name)
        if built is None:
            env = getattr(context, "environment", None)
            built = _runtimes[name] = Runtime.from_session(_session_for(name), READS[step], env)
        return built
