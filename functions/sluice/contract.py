"""What infra/, the Lambda handlers and local/ must agree on, written once.

The CDK app imports this module to synthesize the stack, the Lambdas and the local cloud import it
at run time: the steps and their functions, the settings and the environment variables that carry
them, the defaults, the table's keys and index, the S3 key layout, the metric namespace, the job
statuses, and what each step returns into the workflow's state. Standard library only, so that
`cdk synth` needs nothing of the Lambda code's dependencies, and nothing here creates a client or
reads the environment at import.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any, ClassVar, Self, TypeVar

# --- the steps ------------------------------------------------------------------------------

# A shard Lambda drives hundreds of sockets and parses every response; 1769 MB is the size at
# which Lambda gives a full vCPU.
FULL_VCPU_MB = 1769


@dataclass(frozen=True)
class Step:
    """One Lambda function: its handler module, timeout and memory."""

    name: str
    timeout_s: int
    memory_mb: int = 1024

    @property
    def module(self) -> str:
        return f"handlers.{self.name}"

    @property
    def handler(self) -> str:
        return f"{self.module}.handler"

    @property
    def construct_id(self) -> str:
        return "".join(part.title() for part in self.name.split("_"))

    @property
    def placeholder(self) -> str:
        """The `${...}` the state machine definition names the function's ARN by."""
        return f"{self.construct_id}FunctionArn"


# One function per state machine step. Steps that work through a shard get Lambda's maximum
# (15 minutes), so that they can drain and checkpoint before the workflow loops them.
STEPS: dict[str, Step] = {
    step.name: step
    for step in (
        # Plan holds every custom_id to find duplicates, ~142 bytes a line: 1.4 GB at 10M lines
        Step("plan", 900, 3008),
        Step("run_shard", 900, FULL_VCPU_MB),
        Step("submit", 900),
        Step("await_shard", 30),
        Step("collect", 900),
        Step("submit_batch", 900),
        Step("collect_batch", 900),
        Step("merge", 900),
        Step("notify", 30),
        Step("mark_failed", 900),
    )
}

# Not a step of the state machine: API Gateway calls it for each provider webhook. It answers
# within a second or two (API Gateway gives up at 30 s, providers sooner); 512 MB buys the CPU
# for a quick cold start.
WEBHOOK = Step("webhook", 10, 512)

# The steps that talk to the provider and work through their shard's rows and checkpoints.
PROVIDER_STEPS = ("run_shard", "submit", "collect", "submit_batch", "collect_batch")

# --- modes and statuses ---------------------------------------------------------------------

MODES = ("direct", "background", "batch", "auto")
# what happens to rows a batch did not finish: `direct` re-runs them, `error` reports them
BATCH_INCOMPLETE_POLICIES = ("direct", "error")
SHARED_LIMIT_CHOICES = ("on", "off")
# the response cache per job: `on` reads and fills it, `read` only reads, `write` only fills
CACHE_MODES = ("on", "read", "write", "off")


class JobStatus:
    """How a job ended, the one word the job row, summary, event, CLI and report all use."""

    SUCCEEDED = "SUCCEEDED"
    # every line is accounted for, but more failed than the job's max error rate allows
    COMPLETED_WITH_ERRORS = "COMPLETED_WITH_ERRORS"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # the job's spending cap stopped it: the lines it did not send are errors `budget_exceeded`
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"


TERMINAL_STATUSES = frozenset(
    {
        JobStatus.SUCCEEDED,
        JobStatus.COMPLETED_WITH_ERRORS,
        JobStatus.FAILED,
        JobStatus.CANCELLED,
        JobStatus.BUDGET_EXCEEDED,
    }
)

# --- the table ------------------------------------------------------------------------------

PARTITION_KEY = "pk"
SORT_KEY = "sk"
TTL_ATTRIBUTE = "expires_at"
# Sparse: only items and shards handed to a provider carry it, so a webhook finds its row
# without the index holding every row.
PROVIDER_ID_ATTRIBUTE = "provider_id"
PROVIDER_ID_INDEX = "by_provider_id"
# what the index copies of a row: its keys, all its one reader (`JobStore._by_provider_id`) uses
PROVIDER_ID_PROJECTION = "KEYS_ONLY"


def create_table_request(name: str) -> dict[str, Any]:
    """DynamoDB CreateTable's arguments for the jobs table, the keys and index infra/storage.py declares."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": attribute, "AttributeType": "S"}
            for attribute in (PARTITION_KEY, SORT_KEY, PROVIDER_ID_ATTRIBUTE)
        ],
        "KeySchema": [
            {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": PROVIDER_ID_INDEX,
                "KeySchema": [{"AttributeName": PROVIDER_ID_ATTRIBUTE, "KeyType": "HASH"}],
                "Projection": {"ProjectionType": PROVIDER_ID_PROJECTION},
            }
        ],
    }


# --- the bucket -----------------------------------------------------------------------------

# users drop inputs here (the EventBridge rule matches `inbox/*.jsonl`) ...
INBOX_PREFIX = "inbox/"
# ... each job keeps its working files under jobs/<job id>/ ...
JOBS_PREFIX = "jobs/"
# ... and the merged outputs appear here
OUTBOX_PREFIX = "outbox/"
# the response cache's segments and indexes (`sluice.cache`), expired after `cache_ttl_days`
CACHE_PREFIX = "cache/"


def job_prefix(job_id: str) -> str:
    return f"{JOBS_PREFIX}{job_id}/"


def manifest_key(job_id: str) -> str:
    """The shards Plan wrote, which the Distributed Map reads."""
    return f"{job_prefix(job_id)}manifest.json"


# --- metrics --------------------------------------------------------------------------------

# the EMF namespace of every metric, and the `service` dimension
METRICS_NAMESPACE = "Sluice"
SERVICE = "sluice"
# the `environment` dimension: the deployment (`dev`, `prod`, `local`), so two never mix
ENVIRONMENT_VARIABLE = "SLUICE_ENV"

# --- settings -------------------------------------------------------------------------------

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


def parse_budget(raw: str) -> float:
    """A spending cap in US dollars: a finite number above 0; ValueError says what is wrong."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{raw!r} is not an amount of US dollars above 0, such as 12.50")
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


# how a setting's value is read from its variable: `positive` numbers, whole-number `budget`s
# (0 = none), a `choice` of a few words, a `rate` from 0 to 1, or `text`
_KIND = "kind"
_CHOICES = "choices"


@dataclass(frozen=True)
class Settings:
    """Everything a step reads, from the SLUICE_* variables infra and the local cloud set with `to_env`.

    Each field is the variable `SLUICE_<FIELD>`; a field with a default may be left unset.
    """

    bucket: str
    table: str
    provider_base_url: str
    api_key_secret_arn: str
    default_mode: str = field(default="direct", metadata={_KIND: "choice", _CHOICES: MODES})
    # the model of a line whose body names none; a job's `sluice-model` replaces every line's
    default_model: str | None = None
    concurrency: int = 1000
    map_concurrency: int = 20
    # shards working at once across the environment's jobs (the shard steps' reserved concurrency);
    # a job's map concurrency above it only makes shards wait (0 = no cap, as in a local run)
    max_shards_in_flight: int = field(default=0, metadata={_KIND: "budget"})
    max_attempts: int = 6
    request_timeout_s: float = 120.0
    shard_lines: int = 5000
    ttl_days: int = 14
    event_bus: str = "default"
    poll_seconds: int = 10
    # first retry waits up to this long (full jitter), doubling per attempt
    retry_base_delay_s: float = 0.5
    # requests and tokens per minute for a whole job (0 = no budget), shared by running shards
    rpm: int = field(default=0, metadata={_KIND: "budget"})
    tpm: int = field(default=0, metadata={_KIND: "budget"})
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
    batch_queue_default_tokens: int = field(default=DEFAULT_BATCH_QUEUE_DEFAULT_TOKENS, metadata={_KIND: "budget"})
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
    # how long the bucket keeps an answer (cdk.json `cache_ttl_days`): Plan counts on none older,
    # and compaction drops them; 0: answers never expire (a local directory)
    cache_ttl_days: int = field(default=0, metadata={_KIND: "days"})

    @property
    def cache_provider_name(self) -> str:
        return self.cache_provider or self.provider_base_url

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
    if how == "budget":
        if not raw.isdigit():
            raise SettingsError(f"{name}={raw!r} is not a whole number (0 means no budget)")
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
        if not 0 <= value < float("inf"):
            raise SettingsError(f"{name}={raw!r} is not an amount of US dollars (0 means no budget)")
        return value
    if how == "rate_limits":
        try:
            parse_rate_limits(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}: {exc}") from exc
        return raw
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


# --- the workflow's state -------------------------------------------------------------------

T = TypeVar("T")


class StateError(ValueError):
    """A step was handed a state it does not know: a typo in the definition or a step, never a default."""


def strict(cls: type[T], data: Mapping[str, Any], what: str) -> T:
    """`cls(**data)`, refusing a key `cls` has no field for and naming a missing one."""
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise StateError(f"{what}: unknown key(s) {', '.join(unknown)}; expected {', '.join(known)}")
    missing = [
        name for name, f in known.items() if name not in data and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise StateError(f"{what}: missing key(s) {', '.join(missing)}")
    return cls(**data)


@dataclass(frozen=True)
class StepResult:
    """What one step returns. The definition keeps it at `$.<KEY>` (its ResultPath), names its
    fields with `path`, and copies exactly these fields out of the Lambda's answer (`selector`)."""

    KEY: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return strict(cls, data, f"{cls.KEY}'s result")

    @classmethod
    def path(cls, name: str) -> str:
        """The JSONPath of one field in the state, for a Choice or a `...Path` field."""
        if name not in {f.name for f in fields(cls)}:
            raise KeyError(f"{cls.__name__} has no field {name!r}")
        return f"$.{cls.KEY}.{name}"

    @classmethod
    def selector(cls) -> dict[str, str]:
        """The ResultSelector that keeps these fields of the Lambda's answer, and nothing else."""
        return {f"{f.name}.$": f"$.Payload.{f.name}" for f in fields(cls)}


@dataclass(frozen=True)
class Planned(StepResult):
    """Plan: the job the Map and Merge work on; `duplicate` when the object already ran."""

    KEY: ClassVar[str] = "plan"
    job_id: str
    bucket: str
    key: str
    etag: str
    manifest_key: str
    output_prefix: str
    map_concurrency: int
    duplicate: bool
    shards: int = 0
    lines: int = 0


@dataclass(frozen=True)
class DirectRun(StepResult):
    """RunShard: `done` once every line of the shard has its outcome; else it runs again."""

    KEY: ClassVar[str] = "run_shard"
    done: bool
    run: int
    sent: int
    seconds: float = 0.0
    # the job was cancelled or has failed: the shard stopped taking lines
    cancelled: bool = False


@dataclass(frozen=True)
class Submitted(StepResult):
    """Submit: `submitted` once every line is with the provider; then wait `wait_seconds` for webhooks."""

    KEY: ClassVar[str] = "submit"
    submitted: bool
    run: int
    wait_seconds: int
    # when the shard first waited (epoch seconds): how long its responses have had, across runs
    waiting_since: float


@dataclass(frozen=True)
class Collected(StepResult):
    """Collect: `done` once every response settled; else wait `wait_seconds` and collect again."""

    KEY: ClassVar[str] = "collect"
    done: bool
    waiting: int
    wait_seconds: int


@dataclass(frozen=True)
class BatchSubmitted(StepResult):
    """SubmitBatch: the shard's batches exist at the provider; wait `wait_seconds` for them."""

    KEY: ClassVar[str] = "submit_batch"
    batch_ids: list[str]
    batches_created: int
    requests: int
    wait_seconds: int


@dataclass(frozen=True)
class BatchCollected(StepResult):
    """CollectBatch: `done`; or `fallback`, rows the batches did not finish go to RunShard; else wait."""

    KEY: ClassVar[str] = "collect_batch"
    done: bool
    fallback: bool
    waiting: int
    collected: int
    wait_seconds: int


@dataclass(frozen=True)
class Merged(StepResult):
    """Merge: how the job ended and where its outputs are; Notify publishes it as the event's detail."""

    KEY: ClassVar[str] = "merge"
    job_id: str
    bucket: str
    key: str
    status: str
    counts: dict[str, int]
    error_rate: float
    max_error_rate: float
    outputs: dict[str, str]


@dataclass(frozen=True)
class MarkedFailed(StepResult):
    """MarkFailed: `done` once every line is accounted for and the job ended FAILED; else the
    `shards_left` to assemble wait for its next run."""

    KEY: ClassVar[str] = "mark_failed"
    done: bool
    shards_left: int = 0


# where the definition puts MarkFailed's own failure: MarkFailed then records only the job's end
MARK_FAILED_ERROR_KEY = "mark_failed_error"

# the key of a Map child's state that holds its shard (the definition's ItemSelector)
SHARD_KEY = "shard"


@dataclass(frozen=True)
class ShardState:
    """A Map child's state: its shard (a manifest item, as Plan wrote it) and what its steps returned."""

    # the manifest item: the core's ShardSpec, read by the handlers with `strict`
    shard: dict[str, Any]
    run_shard: DirectRun | None = None
    submit: Submitted | None = None
    collect: Collected | None = None
    submit_batch: BatchSubmitted | None = None
    collect_batch: BatchCollected | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardState:
        raw = strict(cls, data, "a shard's state")
        results: dict[str, Any] = {}
        for result in (DirectRun, Submitted, Collected, BatchSubmitted, BatchCollected):
            value = data.get(result.KEY)
            if value is not None:
                results[result.KEY] = result.from_dict(value)
        return replace(raw, **results)


# --- the job's summary ----------------------------------------------------------------------

# The summary's key for a provider that refused a shard's requests (issue 31): `null`, or a
# `ProviderRefused` as a JSON object. The CLI exits 8 when it is set.
PROVIDER_REFUSED = "provider_refused"


@dataclass(frozen=True)
class ProviderRefused:
    """Why a shard stopped sending: the first answers of its run were all this one non-retryable
    error. `status` is the HTTP status, `message` the provider's error message, `cause` the likely
    cause in plain words, `lines` the lines not sent because of it (in the summary, the job's)."""

    status: int
    message: str
    cause: str
    lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProviderRefused:
        return strict(cls, data, PROVIDER_REFUSED)
