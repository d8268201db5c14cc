"""The settings every step reads from its SLUICE_* variables, how each is parsed, and their defaults."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from .layout import LOCAL_BEDROCK_JOB_NAME_PREFIX
from .status import (
    BATCH_INCOMPLETE_POLICIES,
    CACHE_MODES,
    DEFAULT_PROVIDER,
    MODES,
    PROVIDERS,
    SHARED_LIMIT_CHOICES,
    VALIDATE_REPAIR_CHOICES,
    parse_validate,
)
from .steps import STEPS

DEFAULT_PROVIDER_BASE_URL = "https://api.openai.com/v1"


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


# OpenAI's Batch queue limits at usage tier 1 (platform.openai.com/docs/guides/rate-limits,
# "Usage tiers": the "Batch queue limit" column), the lowest paid tier: a higher tier only
# waits less than it could. A model not named gets the smallest of them.
TIER1_BATCH_QUEUE_TOKENS: dict[str, int] = {
    "gpt-4o-mini": 2_000_000,
    "gpt-4o": 90_000,
    "gpt-4-turbo": 90_000,
    "gpt-4": 100_000,
    "gpt-3.5-turbo": 2_000_000,
    "o1-mini": 2_000_000,
    "o1-preview": 90_000,
    "text-embedding-3-small": 3_000_000,
    "text-embedding-3-large": 3_000_000,
    "text-embedding-ada-002": 3_000_000,
}
DEFAULT_BATCH_QUEUE_DEFAULT_TOKENS = 90_000
# Bedrock's batch inference jobs in progress or submitted at once per base model, the quota's
# default (docs.aws.amazon.com/bedrock/latest/userguide/quotas.html)
DEFAULT_BEDROCK_BATCH_JOBS_QUOTA = 20


def queue_tokens_text(limits: Mapping[str, int]) -> str:
    """Per-model queue limits as the one-line text `parse_queue_tokens` reads."""
    return ",".join(f"{model}={tokens}" for model, tokens in limits.items())


def parse_queue_tokens(text: str) -> dict[str, int]:
    """`model=tokens,model=tokens` (0 = no limit); ValueError says what is wrong."""
    limits: dict[str, int] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        model, sep, tokens = entry.rpartition("=")
        if not sep or not model or not tokens.isdigit():
            raise ValueError(f"expected model=tokens (a whole number, 0 for none), got {entry!r}")
        limits[model] = int(tokens)
    return limits


DEFAULT_BATCH_QUEUE_TOKENS = queue_tokens_text(TIER1_BATCH_QUEUE_TOKENS)


# The job row counts a budget in whole nano-dollars (`sluice.limits.budget`); a billion dollars is
# 1e18 of them, within a signed 64-bit integer and DynamoDB's 38 digits, where 1e30 dollars is not
MAX_BUDGET_USD = 1e9


def parse_budget(raw: str) -> float:
    """A spending cap in US dollars: a number above 0, up to MAX_BUDGET_USD; ValueError says what is wrong."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{raw!r} is not an amount of US dollars above 0, such as 12.50")
    if value > MAX_BUDGET_USD:
        raise ValueError(f"{raw!r} is more than the largest budget Sluice counts, ${MAX_BUDGET_USD:,.0f}")
    return value


@dataclass(frozen=True)
class RateSeed:
    """A provider's limits for one model, per minute, as configured: they seed the shared limit
    until the provider's headers say otherwise (0 = not configured)."""

    rpm: float = 0
    tpm: float = 0


def parse_rate_limits(text: str | None) -> dict[str, RateSeed]:
    """`{"<model>": {"rpm": 30000, "tpm": 150000000}, ...}` (JSON); ValueError says what is wrong.
    A model's `rpm` is required, its `tpm` optional."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError('expected a JSON object of models, such as {"gpt-4o-mini": {"rpm": 30000}}') from None
    if not isinstance(raw, dict):
        raise ValueError('expected an object of models, such as {"gpt-4o-mini": {"rpm": 30000}}')
    seeds: dict[str, RateSeed] = {}
    for model, limits in raw.items():
        if not isinstance(limits, dict) or set(limits) - {"rpm", "tpm"} or "rpm" not in limits:
            raise ValueError(f'{model}: expected {{"rpm": <requests a minute>, "tpm": <tokens a minute>}}')
        values = [limits.get("rpm"), limits.get("tpm", 0)]
        if any(type(v) not in (int, float) or not math.isfinite(v) or v < 0 for v in values) or not values[0]:
            raise ValueError(f"{model}: rpm must be a positive number and tpm a number >= 0")
        seeds[str(model)] = RateSeed(float(values[0]), float(values[1]))
    return seeds


def _variable(name: str) -> str:
    return "SLUICE_" + name.upper()


# how a setting's value is read from its variable: `positive` numbers, whole-number `limit`s
# (0 = no limit), a `choice` of a few words, a `rate` from 0 to 1, or `text`
_KIND = "kind"
_CHOICES = "one_of"


@dataclass(frozen=True)
class Settings:
    """Everything a step reads, from the SLUICE_* variables infra and the local cloud set with `to_env`.

    Each field is the variable `SLUICE_<FIELD>`; a field with a default may be left unset.
    """

    bucket: str
    table: str
    provider_base_url: str
    api_key_secret_arn: str
    # the provider family `provider_base_url` speaks (`sluice.providers`): its request format
    provider: str = field(default=DEFAULT_PROVIDER, metadata={_KIND: "choice", _CHOICES: PROVIDERS})
    default_mode: str = field(default="direct", metadata={_KIND: "choice", _CHOICES: MODES})
    # the model of a line whose body names none; a job's `sluice-model` replaces every line's
    default_model: str | None = None
    concurrency: int = 1000
    map_concurrency: int = 20
    # shards working at once across the environment's jobs (the shard steps' reserved concurrency);
    # a job's map concurrency above it only makes shards wait (0 = no cap, as in a local run)
    max_shards_in_flight: int = field(default=0, metadata={_KIND: "limit"})
    # sends of a line at most; 0: as many as the shard's faults call for (`sluice.runners.sweep`)
    max_attempts: int = field(default=0, metadata={_KIND: "limit"})
    request_timeout_s: float = 120.0
    shard_lines: int = 5000
    ttl_days: int = 14
    event_bus: str = "default"
    poll_seconds: int = 10
    # first retry waits up to this long (full jitter), doubling per attempt
    retry_base_delay_s: float = 0.5
    # requests and tokens per minute for a whole job (0 = no limit), shared by running shards
    rpm: int = field(default=0, metadata={_KIND: "limit"})
    tpm: int = field(default=0, metadata={_KIND: "limit"})
    # stop taking new items this long (plus the request timeout) before the Lambda's end
    safety_margin_s: float = 20.0
    # the OpenAI Batch API's limits per input file
    batch_max_requests: int = 50_000
    batch_max_bytes: int = 200 * 1024 * 1024
    # webhooks wake a batch shard when it ends; polling only reconciles, so it backs off to this
    batch_poll_max_s: int = 300
    # the provider's Batch queue: input tokens enqueued at once per model and organization
    # (`model=tokens,...`; 0 = no limit), and the limit of a model not named
    batch_queue_tokens: str = field(default=DEFAULT_BATCH_QUEUE_TOKENS, metadata={_KIND: "queue_tokens"})
    batch_queue_default_tokens: int = field(default=DEFAULT_BATCH_QUEUE_DEFAULT_TOKENS, metadata={_KIND: "limit"})
    # Bedrock's quota of batch inference jobs at once per model in the account and region, of which
    # Sluice holds at most half (`sluice.providers.bedrock.batch.held_jobs`)
    bedrock_batch_jobs_quota: int = field(default=DEFAULT_BEDROCK_BATCH_JOBS_QUOTA, metadata={_KIND: "limit"})
    # how long a cancelled batch may take to end and hand back its answers (OpenAI's `cancelling`
    # lasts up to 10 minutes): a deadline job cancels a late batch this long before it must send
    # the rest directly (`sluice.plan.deadline`)
    batch_cancel_s: float = 600.0
    # auto mode sends a shard through the Batch API from this many requests up
    auto_batch_min_requests: int = 1000
    on_batch_incomplete: str = field(default="direct", metadata={_KIND: "choice", _CHOICES: BATCH_INCOMPLETE_POLICIES})
    # a job whose failed lines are more than this share of its requests ends COMPLETED_WITH_ERRORS;
    # 0 means any failed line does, so a script reading only the outcome never mistakes a loss
    max_error_rate: float = field(default=0.0, metadata={_KIND: "rate"})
    # "on": every shard of every job on the same provider key and model draws from one rate
    # limit in the table (`shared_limit`), learned from the provider's rate-limit headers
    shared_limit: str = field(default="on", metadata={_KIND: "choice", _CHOICES: SHARED_LIMIT_CHOICES})
    # a job's spending cap in US dollars when it sets no `sluice-budget-usd` (0 = none)
    budget_usd: float = field(default=0.0, metadata={_KIND: "usd"})

    def batch_queue_limit(self, model: str | None) -> int:
        """The enqueued-token limit of `model`'s Batch queue; 0 = none."""
        limits = parse_queue_tokens(self.batch_queue_tokens)
        return limits.get(model or "", self.batch_queue_default_tokens)

    # the provider's limits per model (`parse_rate_limits`'s JSON), seeding the shared limit
    # before its headers are seen
    rate_limits: str | None = field(default=None, metadata={_KIND: "rate_limits"})

    # the response cache for a job that does not choose (`sluice-cache`)
    cache: str = field(default="on", metadata={_KIND: "choice", _CHOICES: CACHE_MODES})
    # local runs only: the directory that holds the cache instead of the bucket's `cache/`
    cache_dir: str | None = None
    # what the cache's keys name the provider by, when not its base URL: `sluice run`'s built-in
    # simulator gets a new port each run, yet answers the same
    cache_provider: str | None = None
    # the role Amazon Bedrock batch inference jobs run as (the stack's), which the batch steps pass it
    bedrock_batch_role_arn: str | None = None
    # what the environment's Bedrock batch inference jobs are named by (`bedrock_job_name_prefix`)
    bedrock_job_prefix: str = LOCAL_BEDROCK_JOB_NAME_PREFIX
    # how long the bucket keeps an answer (cdk.json `cache_ttl_days`): Plan counts on none older,
    # and compaction drops them; 0: answers never expire (a local directory)
    cache_ttl_days: int = field(default=0, metadata={_KIND: "days"})

    # per-line output validation for a job that does not choose (`sluice-validate`): the checks
    # (`parse_validate`: all, none, or names), how many times an answer is sent in all, and whether
    # a resend adds what was wrong as a follow-up turn
    validate: str = field(default="", metadata={_KIND: "validate"})
    validate_attempts: int = 3
    validate_repair: str = field(default="off", metadata={_KIND: "choice", _CHOICES: VALIDATE_REPAIR_CHOICES})

    @property
    def cache_provider_name(self) -> str:
        return self.cache_provider or self.provider_base_url

    @classmethod
    def variable(cls, name: str) -> str:
        """The variable of the field `name`, for a value only infra knows (a resource's ARN)."""
        if name not in {f.name for f in fields(cls)}:
            raise KeyError(f"{cls.__name__} has no field {name!r}")
        return _variable(name)

    def to_env(self) -> dict[str, str]:
        """The variables `from_env` reads back into these settings; an unset optional is left out."""
        return {
            _variable(f.name): str(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = _variable(f.name)
            raw = env.get(name)
            if f.default is MISSING:
                if not raw:
                    raise SettingsError(f"missing required setting {name}")
                values[f.name] = raw
            elif raw not in (None, ""):
                values[f.name] = _parse(name, raw, f.type, f.metadata)
        return cls(**values)


def _parse(name: str, raw: str, kind: Any, metadata: Mapping[str, Any]) -> Any:
    how = metadata.get(_KIND)
    if how == "choice":
        if raw not in metadata[_CHOICES]:
            raise SettingsError(f"{name}={raw!r}; expected one of {', '.join(metadata[_CHOICES])}")
        return raw
    if how == "days":
        if not raw.isdigit():
            raise SettingsError(f"{name}={raw!r} is not a whole number of days (0 means never)")
        return int(raw)
    if how == "limit":
        if not raw.isdigit():
            raise SettingsError(f"{name}={raw!r} is not a whole number (0 means no limit)")
        return int(raw)
    if how == "queue_tokens":
        try:
            parse_queue_tokens(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r}: {exc}") from exc
        return raw
    if how == "usd":
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 <= value <= MAX_BUDGET_USD:
            raise SettingsError(
                f"{name}={raw!r} is not an amount of US dollars up to {MAX_BUDGET_USD:,.0f} (0 means no budget)"
            )
        return value
    if how == "rate_limits":
        try:
            parse_rate_limits(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}: {exc}") from exc
        return raw
    if how == "validate":
        try:
            return ",".join(parse_validate(raw))
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r}: {exc}") from exc
    if how == "rate":
        try:
            return parse_error_rate(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r}: {exc}") from exc
    # `from __future__ import annotations` leaves the field types as their source text
    if kind in ("int", "float"):
        number = int if kind == "int" else float
        try:
            value = number(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r} is not a {kind}") from exc
        if value <= 0:
            raise SettingsError(f"{name} must be positive, got {raw}")
        return value
    return raw


SETTING_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Settings) if f.default is not MISSING}

# A shard stops taking lines once less than a request timeout plus its safety margin is left of its
# Lambda's time (`sluice.shard.frame.margin_s`): a timeout this long or more leaves it none, so it
# would fail without sending a line
MAX_REQUEST_TIMEOUT_S: float = STEPS["run_shard"].timeout_s - SETTING_DEFAULTS["safety_margin_s"]

# A local run (`sluice run`, `sluice_local.cloud.LocalSettings`) changes two: its shards share one
# machine's cores, so fewer run at once, and the simulator answers within seconds, so a background
# shard need not wait 10 s to look again.
LOCAL_SETTING_DEFAULTS: dict[str, Any] = {**SETTING_DEFAULTS, "map_concurrency": 10, "poll_seconds": 1}


@dataclass(frozen=True)
class WebhookSettings:
    """What the webhook receiver reads: its table and signing secret; no bucket, provider or API key."""

    table: str
    webhook_secret_arn: str
    ttl_days: int = SETTING_DEFAULTS["ttl_days"]

    def to_env(self) -> dict[str, str]:
        return {_variable(f.name): str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WebhookSettings:
        env = os.environ if env is None else env
        table, secret_arn = env.get(_variable("table")), env.get(_variable("webhook_secret_arn"))
        if not table or not secret_arn:
            raise SettingsError("SLUICE_TABLE and SLUICE_WEBHOOK_SECRET_ARN must be set")
        ttl_days = env.get(_variable("ttl_days"))
        return cls(
            table,
            secret_arn,
            _parse("SLUICE_TTL_DAYS", ttl_days, "int", {}) if ttl_days else SETTING_DEFAULTS["ttl_days"],
        )
