"""Settings for the Lambda steps, read once from the environment into one typed object."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

MODES = ("direct", "background", "batch", "auto")
BATCH_INCOMPLETE_POLICIES = ("direct", "error")


class SettingsError(RuntimeError):
    pass


def parse_error_rate(raw: str) -> float:
    """A share of a job's requests, 0 to 1 (0.01 = 1%); ValueError says what is wrong."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number from 0 to 1, such as 0.01 for 1%") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError("expected a number from 0 to 1, such as 0.01 for 1%")
    return value


@dataclass(frozen=True)
class Settings:
    bucket: str
    table: str
    provider_base_url: str
    api_key_secret_arn: str
    default_mode: str = "direct"
    concurrency: int = 1000
    map_concurrency: int = 20
    max_attempts: int = 6
    request_timeout_s: float = 120.0
    shard_lines: int = 5000
    ttl_days: int = 14
    event_bus: str = "default"
    poll_seconds: int = 10
    # first retry waits up to this long (full jitter), doubling per attempt
    retry_base_delay_s: float = 0.5
    # requests and tokens per minute for a whole job (0 = no budget), shared by running shards
    rpm: int = 0
    tpm: int = 0
    # stop taking new items this long (plus the request timeout) before the Lambda's end
    safety_margin_s: float = 20.0
    # the OpenAI Batch API's limits per input file
    batch_max_requests: int = 50_000
    batch_max_bytes: int = 200 * 1024 * 1024
    # webhooks wake a batch shard when it ends; polling only reconciles, so it backs off to this
    batch_poll_max_s: int = 300
    # auto mode sends a shard through the Batch API from this many requests up
    auto_batch_min_requests: int = 1000
    # what happens to rows a batch did not finish: `direct` re-runs them, `error` reports them
    on_batch_incomplete: str = "direct"
    # the deployment (`dev`, `prod`, `local`): a dimension of every metric, so two never mix
    environment: str = "local"
    # a job whose failed lines are more than this share of its requests ends COMPLETED_WITH_ERRORS;
    # 0 means any failed line does, so a script reading only the outcome never mistakes a loss
    max_error_rate: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env

        def need(name: str) -> str:
            value = env.get(name)
            if not value:
                raise SettingsError(f"missing required setting {name}")
            return value

        def number(name: str, default: float, kind: type = int) -> float:
            raw = env.get(name)
            if raw in (None, ""):
                return default
            try:
                value = kind(raw)
            except ValueError as exc:
                raise SettingsError(f"{name}={raw!r} is not a {kind.__name__}") from exc
            if value <= 0:
                raise SettingsError(f"{name} must be positive, got {raw}")
            return value

        def budget(name: str) -> int:
            raw = env.get(name) or "0"
            if not raw.isdigit():
                raise SettingsError(f"{name}={raw!r} is not a whole number (0 means no budget)")
            return int(raw)

        mode = env.get("SLUICE_DEFAULT_MODE", "direct")
        if mode not in MODES:
            raise SettingsError(f"SLUICE_DEFAULT_MODE={mode!r}; expected one of {', '.join(MODES)}")
        incomplete = env.get("SLUICE_ON_BATCH_INCOMPLETE", "direct")
        if incomplete not in BATCH_INCOMPLETE_POLICIES:
            raise SettingsError(
                f"SLUICE_ON_BATCH_INCOMPLETE={incomplete!r}; expected one of {', '.join(BATCH_INCOMPLETE_POLICIES)}"
            )
        raw_rate = env.get("SLUICE_MAX_ERROR_RATE") or "0"
        try:
            max_error_rate = parse_error_rate(raw_rate)
        except ValueError as exc:
            raise SettingsError(f"SLUICE_MAX_ERROR_RATE={raw_rate!r}: {exc}") from exc
        return cls(
            bucket=need("SLUICE_BUCKET"),
            table=need("SLUICE_TABLE"),
            provider_base_url=need("SLUICE_PROVIDER_BASE_URL"),
            api_key_secret_arn=need("SLUICE_API_KEY_SECRET_ARN"),
            default_mode=mode,
            concurrency=int(number("SLUICE_CONCURRENCY", 1000)),
            map_concurrency=int(number("SLUICE_MAP_CONCURRENCY", 20)),
            max_attempts=int(number("SLUICE_MAX_ATTEMPTS", 6)),
            request_timeout_s=float(number("SLUICE_REQUEST_TIMEOUT_S", 120.0, float)),
            shard_lines=int(number("SLUICE_SHARD_LINES", 5000)),
            ttl_days=int(number("SLUICE_TTL_DAYS", 14)),
            event_bus=env.get("SLUICE_EVENT_BUS", "default"),
            poll_seconds=int(number("SLUICE_POLL_SECONDS", 10)),
            safety_margin_s=float(number("SLUICE_SAFETY_MARGIN_S", 20.0, float)),
            retry_base_delay_s=float(number("SLUICE_RETRY_BASE_DELAY_S", 0.5, float)),
            rpm=budget("SLUICE_RPM"),
            tpm=budget("SLUICE_TPM"),
            batch_max_requests=int(number("SLUICE_BATCH_MAX_REQUESTS", 50_000)),
            batch_max_bytes=int(number("SLUICE_BATCH_MAX_BYTES", 200 * 1024 * 1024)),
            batch_poll_max_s=int(number("SLUICE_BATCH_POLL_MAX_S", 300)),
            auto_batch_min_requests=int(number("SLUICE_AUTO_BATCH_MIN_REQUESTS", 1000)),
            on_batch_incomplete=incomplete,
            environment=env.get("SLUICE_ENV") or "local",
            max_error_rate=max_error_rate,
        )
