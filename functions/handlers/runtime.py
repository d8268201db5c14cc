"""Clients and settings, built once per Lambda container on first use (never at import)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import boto3
from sluice.engine import make_session
from sluice.settings import Settings
from sluice.shard import ShardContext
from sluice.store import JobStore


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    s3: Any
    events: Any
    store: JobStore
    secrets: Any
    sfn: Any

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


@functools.cache
def runtime() -> Runtime:
    settings = Settings.from_env()
    table = boto3.resource("dynamodb").Table(settings.table)
    return Runtime(
        settings=settings,
        s3=boto3.client("s3"),
        events=boto3.client("events"),
        store=JobStore(table, ttl_days=settings.ttl_days),
        secrets=boto3.client("secretsmanager"),
        sfn=boto3.client("stepfunctions"),
    )
