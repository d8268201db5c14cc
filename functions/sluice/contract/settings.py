"""The settings the steps read from their SLUICE_* variables, in small sets, and their defaults.

Each set is a few settings read together (the job table's, the provider's, the Batch API's, ...);
each step declares the sets it reads (`sluice.contract.step_settings`), and infra gives its
function only their variables. `Settings` is every set at once: a step's is built with
`Settings.reading`, holding only its own sets' fields, so reading another set's fails loudly.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Self

from . import setting_parsers as parse
from .layout import LOCAL_BEDROCK_JOB_NAME_PREFIX
from .setting_parsers import (
    MAX_BUDGET_USD,
    Parser,
    RateSeed,
    SettingsError,
    parse_budget,
    parse_error_rate,
    parse_prices,
    parse_queue_tokens,
    parse_rate_limits,
    queue_tokens_text,
)
from .status import (
    BATCH_INCOMPLETE_POLICIES,
    CACHE_MODES,
    DEFAULT_PROVIDER,
    MODES,
    PROVIDERS,
    SHARED_LIMIT_CHOICES,
    VALIDATE_REPAIR_CHOICES,
)
from .steps import STEPS

__all__ = [
    "MAX_BUDGET_USD",
    "RateSeed",
    "SettingsError",
    "parse_budget",
    "parse_error_rate",
    "parse_prices",
    "parse_queue_tokens",
    "parse_rate_limits",
    "queue_tokens_text",
]

DEFAULT_PROVIDER_BASE_URL = "https://api.openai.com/v1"

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
DEFAULT_BATCH_QUEUE_TOKENS = queue_tokens_text(TIER1_BATCH_QUEUE_TOKENS)
# Bedrock's batch inference jobs in progress or submitted at once per base model, the quota's
# default (docs.aws.amazon.com/bedrock/latest/userguide/quotas.html)
DEFAULT_BEDROCK_BATCH_JOBS_QUOTA = 20

_PARSER = "parser"
_REQUIRED: Any = object()


def setting(parser: Parser = parse.text, default: Any = _REQUIRED) -> Any:
    """A setting read from its variable by `parser`; one without a default must be set.

    The default comes from a factory so that the class holds no value of its own: a setting of a
    set the step does not read is absent from its `Settings`, and reading it raises."""
    if default is _REQUIRED:
        return field(metadata={_PARSER: parser})
    return field(default_factory=lambda: default, metadata={_PARSER: parser})


def _variable(name: str) -> str:
    return "SLUICE_" + name.upper()


def _read(chosen: Iterable[Field[Any]], env: Mapping[str, str] | None) -> dict[str, Any]:
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in chosen:
        name = _variable(f.name)
        raw = env.get(name)
        if raw:
            values[f.name] = f.metadata[_PARSER](name, raw)
        elif f.default_factory is MISSING:
            raise SettingsError(f"missing required setting {name}")
        else:
            values[f.name] = f.default_factory()
    return values


class SettingsSet:
    """A few settings a step reads together; each field is the variable `SLUICE_<FIELD>`.

    A set is only ever built as part of `Settings` or `WebhookSettings`, which make their own
    `__init__`, `__repr__` and `__eq__`: a set makes none of its own, which would only lengthen
    every cold start."""

    if TYPE_CHECKING:
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @classmethod
    def variable(cls, name: str) -> str:
        """The variable of the field `name`, for a value only infra knows (a resource's ARN)."""
        if name not in {f.name for f in fields(cls)}:
            raise KeyError(f"{cls.__name__} has no field {name!r}")
        return _variable(name)

    @classmethod
    def variables(cls) -> frozenset[str]:
        return frozenset(_variable(f.name) for f in fields(cls))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        return cls(**_read(fields(cls), env))

    def to_env(self) -> dict[str, str]:
        """The variables `from_env` reads back into these settings; an unset optional is left out."""
        return {_variable(name): str(value) for name, value in vars(self).items() if value is not None}

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            # only a field left out by `Settings.reading` gets here: its set is not the step's
            owner = next((s for s in type(self).__mro__ if name in vars(s).get("__annotations__", {})), None)
            if owner is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            raise SettingsError(
                f"{_variable(name)} is a {owner.__name__} setting, which this step does not read "
                "(sluice.contract.step_settings)"
            )


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class JobTable(SettingsSet):
    """The jobs table, which every function reads and writes."""

    table: str = setting()
    ttl_days: int = setting(parse.positive_int, 14)


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class JobBucket(SettingsSet):
    """The bucket of inputs, outputs and the response cache."""

    bucket: str = setting()


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class Provider(SettingsSet):
    """Where requests go and in what format."""

    provider_base_url: str = setting()
    # the provider family `provider_base_url` speaks (`sluice.providers`): its request format
    provider: str = setting(parse.one_of(PROVIDERS), DEFAULT_PROVIDER)
    # the model of a line whose body names none; a job's `sluice-model` replaces every line's
    default_model: str | None = setting(parse.text, None)
    # prices that override the maintained source's, {"my-finetune": [0.3, 1.2]} (`sluice.core.prices`)
    # (its text, checked where a price is looked up: a bad one fails the job with every line an
    # error naming it, where a failed parse here would stop even the step that accounts for them)
    prices: str | None = setting(parse.text, None)


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class ProviderKey(SettingsSet):
    """The secret holding the provider's API key; only the steps that call the provider read it."""

    api_key_secret_arn: str = setting()


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class Send(SettingsSet):
    """How a shard step sends its lines and paces its looks at the provider."""

    request_timeout_s: float = setting(parse.positive_float, 120.0)
    # first retry waits up to this long (full jitter), doubling per attempt
    retry_base_delay_s: float = setting(parse.positive_float, 0.5)
    # stop taking new items this long (plus the request timeout) before the Lambda's end
    safety_margin_s: float = setting(parse.positive_float, 20.0)
    poll_seconds: int = setting(parse.positive_int, 10)


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class SharedLimits(SettingsSet):
    """The provider's rate limits as the environment shares them."""

    # "on": every shard of every job on the same provider key and model draws from one rate
    # limit in the table (`shared_limit`), learned from the provider's rate-limit headers
    shared_limit: str = setting(parse.one_of(SHARED_LIMIT_CHOICES), "on")
    # the provider's limits per model (`parse_rate_limits`'s JSON), seeding the shared limit
    # before its headers are seen
    rate_limits: str | None = setting(parse.rate_limits, None)


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class Batch(SettingsSet):
    """The Batch APIs' limits, and what Bedrock's batch inference jobs run as."""

    # the OpenAI Batch API's limits per input file
    batch_max_requests: int = setting(parse.positive_int, 50_000)
    batch_max_bytes: int = setting(parse.positive_int, 200 * 1024 * 1024)
    # webhooks wake a batch shard when it ends; polling only reconciles, so it backs off to this
    batch_poll_max_s: int = setting(parse.positive_int, 300)
    # the provider's Batch queue: input tokens enqueued at once per model and organization
    # (`model=tokens,...`; 0 = no limit), and the limit of a model not named
    batch_queue_tokens: str = setting(parse.queue_tokens, DEFAULT_BATCH_QUEUE_TOKENS)
    batch_queue_default_tokens: int = setting(parse.limit, DEFAULT_BATCH_QUEUE_DEFAULT_TOKENS)
    # how long a cancelled batch may take to end and hand back its answers (OpenAI's `cancelling`
    # lasts up to 10 minutes): a deadline job cancels a late batch this long before it must send
    # the rest directly (`sluice.plan.deadline`)
    batch_cancel_s: float = setting(parse.positive_float, 600.0)
    # Bedrock's quota of batch inference jobs at once per model in the account and region, of which
    # Sluice holds at most half (`sluice.providers.bedrock.batch.held_jobs`)
    bedrock_batch_jobs_quota: int = setting(parse.limit, DEFAULT_BEDROCK_BATCH_JOBS_QUOTA)
    # the role Amazon Bedrock batch inference jobs run as (the stack's), which the batch steps pass it
    bedrock_batch_role_arn: str | None = setting(parse.text, None)
    # what the environment's Bedrock batch inference jobs are named by (`bedrock_job_name_prefix`)
    bedrock_job_prefix: str = setting(parse.text, LOCAL_BEDROCK_JOB_NAME_PREFIX)

    def batch_queue_limit(self, model: str | None) -> int:
        """The enqueued-token limit of `model`'s Batch queue; 0 = none."""
        limits = parse_queue_tokens(self.batch_queue_tokens)
        return limits.get(model or "", self.batch_queue_default_tokens)


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class Cache(SettingsSet):
    """The response cache."""

    # the response cache for a job that does not choose (`sluice-cache`)
    cache: str = setting(parse.one_of(CACHE_MODES), "on")
    # local runs only: the directory that holds the cache instead of the bucket's `cache/`
    cache_dir: str | None = setting(parse.text, None)
    # what the cache's keys name the provider by, when not its base URL: `sluice run`'s built-in
    # simulator gets a new port each run, yet answers the same
    cache_provider: str | None = setting(parse.text, None)
    # how long the bucket keeps an answer (cdk.json `cache_ttl_days`): Plan counts on none older,
    # and compaction drops them; 0: answers never expire (a local directory)
    cache_ttl_days: int = setting(parse.days, 0)


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class JobDefaults(SettingsSet):
    """What Plan gives a job for each option it does not set itself (`sluice-<option>`)."""

    default_mode: str = setting(parse.one_of(MODES), "direct")
    concurrency: int = setting(parse.positive_int, 1000)
    map_concurrency: int = setting(parse.positive_int, 20)
    # sends of a line at most; 0: as many as the shard's faults call for (`sluice.runners.sweep`)
    max_attempts: int = setting(parse.limit, 0)
    shard_lines: int = setting(parse.positive_int, 5000)
    # requests and tokens per minute for a whole job (0 = no limit), shared by running shards
    rpm: int = setting(parse.limit, 0)
    tpm: int = setting(parse.limit, 0)
    # auto mode sends a shard through the Batch API from this many requests up
    auto_batch_min_requests: int = setting(parse.positive_int, 1000)
    on_batch_incomplete: str = setting(parse.one_of(BATCH_INCOMPLETE_POLICIES), "direct")
    # a job whose failed lines are more than this share of its requests ends COMPLETED_WITH_ERRORS;
    # 0 means any failed line does, so a script reading only the outcome never mistakes a loss
    max_error_rate: float = setting(parse.error_rate, 0.0)
    # a job's spending cap in US dollars when it sets no `sluice-budget-usd` (0 = none)
    budget_usd: float = setting(parse.usd, 0.0)
    # per-line output validation (`sluice-validate`): the checks (`parse_validate`: all, none, or
    # names), how many times an answer is sent in all, and whether a resend adds what was wrong as
    # a follow-up turn
    validate: str = setting(parse.checks, "")
    validate_attempts: int = setting(parse.positive_int, 3)
    validate_repair: str = setting(parse.one_of(VALIDATE_REPAIR_CHOICES), "off")


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class Slots(SettingsSet):
    """The environment's cap on shards in flight (`sluice.limits.shard_slots`)."""

    # shards working at once across the environment's jobs (the shard steps' reserved concurrency);
    # a job's map concurrency above it only makes shards wait (0 = no cap, as in a local run)
    max_shards_in_flight: int = setting(parse.limit, 0)


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class Events(SettingsSet):
    """The bus that a job's end is published on."""

    event_bus: str = setting(parse.text, "default")


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False)
class WebhookSigning(SettingsSet):
    """The secret providers sign their webhooks with."""

    webhook_secret_arn: str = setting()


# listed last set first: a dataclass orders its fields from its last base, so the variables read
# in the order the sets are above
@dataclass(frozen=True, kw_only=True)
class Settings(
    Events, Slots, JobDefaults, Cache, Batch, SharedLimits, Send, ProviderKey, Provider, JobBucket, JobTable
):
    """Every setting of every step; a step's own holds only the sets it reads (`reading`)."""

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{name}={value!r}' for name, value in vars(self).items())})"

    @property
    def cache_provider_name(self) -> str:
        return self.cache_provider or self.provider_base_url

    @classmethod
    def reading(cls, sets: Iterable[type[SettingsSet]], env: Mapping[str, str] | None = None) -> Settings:
        """The settings of `sets` from their variables; any other is absent, and reading it raises."""
        names = {f.name for s in sets for f in fields(s)}
        settings = object.__new__(cls)
        for name, value in _read((f for f in fields(cls) if f.name in names), env).items():
            object.__setattr__(settings, name, value)
        return settings

    def but(self, **changes: Any) -> Settings:
        """A copy with `changes`, of only the sets these settings hold (`dataclasses.replace` needs all)."""
        settings = object.__new__(type(self))
        for name, value in {**vars(self), **changes}.items():
            object.__setattr__(settings, name, value)
        return settings


SETTING_DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory() for f in fields(Settings) if f.default_factory is not MISSING
}

# A shard stops taking lines once less than a request timeout plus its safety margin is left of its
# Lambda's time (`sluice.shard.frame.margin_s`): a timeout this long or more leaves it none, so it
# would fail without sending a line
MAX_REQUEST_TIMEOUT_S: float = STEPS["run_shard"].timeout_s - SETTING_DEFAULTS["safety_margin_s"]

# A local run (`sluice run`, `sluice_local.cloud.LocalSettings`) changes two: its shards share one
# machine's cores, so fewer run at once, and the simulator answers within seconds, so a background
# shard need not wait 10 s to look again.
LOCAL_SETTING_DEFAULTS: dict[str, Any] = {**SETTING_DEFAULTS, "map_concurrency": 10, "poll_seconds": 1}


@dataclass(frozen=True, kw_only=True)
class WebhookSettings(WebhookSigning, JobTable):
    """What the webhook receiver reads: its table and signing secret; no bucket, provider or API key."""
