"""Per-environment settings, read from the `environments` context in cdk.json."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
from constructs import IConstruct
from sluice.contract import (
    DEFAULT_PROVIDER,
    DEFAULT_PROVIDER_BASE_URL,
    SETTING_DEFAULTS,
    SIGNED_PROVIDERS,
    TIER1_BATCH_QUEUE_TOKENS,
    Settings,
)

from infra.config_values import (
    LOG_RETENTION,
    REMOVAL_POLICIES,
    ConfigError,
    check_formats,
    check_keys,
    environment_entry,
    typed_values,
)

CDK_JSON = Path(__file__).resolve().parent.parent / "cdk.json"

# the environment that is production unless cdk.json says otherwise (`production`)
PRODUCTION_NAME = "prod"

# Lambda keeps this much of an account's concurrency unreserved, for every function that reserves
# none (here every step but the webhook receiver, and CDK's own).
UNRESERVED_CONCURRENCY = 100
# A background response sends one webhook when it ends, so webhooks come at most as fast as the
# provider takes requests, `provider_rpm` / 60 a second (30,000 RPM: 500). The endpoint allows
# twice that, for deliveries that bunch up and the provider's retries of refused ones, with a
# burst of twice its rate.
WEBHOOK_HEADROOM = 2
# About what one webhook takes in Lambda (verify, three or four DynamoDB calls, maybe a
# SendTaskSuccess): the function reserves the endpoint's rate times this, and at least the floor.
WEBHOOK_INVOCATION_S = 0.1
WEBHOOK_MIN_CONCURRENCY = 10

# Where an environment's default is not the steps' own (`SETTING_DEFAULTS`), and why; every other
# step setting an environment names defaults as the steps do.
DEPLOYED_DEFAULTS: dict[str, Any] = {
    # the steps need one named: OpenAI's unless cdk.json says otherwise
    "provider_base_url": DEFAULT_PROVIDER_BASE_URL,
    # the bucket's cache/ expires answers (a local directory keeps them: 0)
    "cache_ttl_days": 30,
    # the steps' 0 is no cap (a local run): an environment that names none gets half the account's
    # concurrency less what it reserves (`Environment.derived_shards_in_flight`), never no cap
    "max_shards_in_flight": 0,
    # cdk.json may write null for no cap, as the steps' 0
    "budget_usd": None,
    # cdk.json writes the limits as an object of models, the steps as their text
    "batch_queue_tokens": TIER1_BATCH_QUEUE_TOKENS,
}


# each family's own API, the base URL of an environment whose cdk.json names no other
FAMILY_BASE_URLS = {
    DEFAULT_PROVIDER: DEFAULT_PROVIDER_BASE_URL,
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
}


@dataclass(frozen=True)
class Environment:
    name: str
    map_concurrency: int
    ttl_days: int
    removal_policy: str
    # the response cache's answers (the bucket's cache/) expire this many days after they were written
    cache_ttl_days: int = DEPLOYED_DEFAULTS["cache_ttl_days"]
    # the steps' settings (`sluice.contract.Settings`) default as the steps do
    # the provider family the environment sends to (`sluice.contract.PROVIDERS`): one an
    # environment, with its base URL and its key's secret; a job's `sluice-provider` may only name it
    provider: str = SETTING_DEFAULTS["provider"]
    # the family's own API when cdk.json names none (`FAMILY_BASE_URLS`)
    provider_base_url: str = DEPLOYED_DEFAULTS["provider_base_url"]
    default_model: str | None = SETTING_DEFAULTS["default_model"]
    default_mode: str = SETTING_DEFAULTS["default_mode"]
    concurrency: int = SETTING_DEFAULTS["concurrency"]
    max_attempts: int = SETTING_DEFAULTS["max_attempts"]
    request_timeout_s: float = SETTING_DEFAULTS["request_timeout_s"]
    # a job whose failed lines pass this share of its requests ends COMPLETED_WITH_ERRORS
    max_error_rate: float = SETTING_DEFAULTS["max_error_rate"]
    # a job's spending cap in US dollars when its object sets no `sluice-budget-usd`; 0 or null: none
    budget_usd: float | None = DEPLOYED_DEFAULTS["budget_usd"]
    shard_lines: int = SETTING_DEFAULTS["shard_lines"]
    # output validation for a job that does not choose (`sluice-validate`): the checks ("all",
    # names separated by commas, "" none), the sends an answer gets in all, repair "on" or "off"
    validate: str = SETTING_DEFAULTS["validate"]
    validate_attempts: int = SETTING_DEFAULTS["validate_attempts"]
    validate_repair: str = SETTING_DEFAULTS["validate_repair"]
    poll_seconds: int = SETTING_DEFAULTS["poll_seconds"]
    safety_margin_s: float = SETTING_DEFAULTS["safety_margin_s"]
    # the provider's Batch queue limit per model, in input tokens enqueued at once (0 = none),
    # and the limit of a model not named; the defaults are OpenAI's at usage tier 1
    batch_queue_tokens: Mapping[str, int] = field(default_factory=lambda: dict(DEPLOYED_DEFAULTS["batch_queue_tokens"]))
    batch_queue_default_tokens: int = SETTING_DEFAULTS["batch_queue_default_tokens"]
    # Bedrock's batch inference jobs at once per model in the account (20 until raised); Sluice
    # keeps at most half of them in flight
    bedrock_batch_jobs_quota: int = SETTING_DEFAULTS["bedrock_batch_jobs_quota"]
    # the jobs table's warm throughput, its writes and reads a second (0: a new on-demand table's,
    # 4,000 and 12,000): pre-warmed at creation so that the stated scenario's writes start under
    # half of it instead of waiting for DynamoDB to scale (docs/capacity.md); charged once, as
    # AWS prices pre-warming, for what is above the default
    table_warm_writes_per_s: int = 0
    table_warm_reads_per_s: int = 0
    log_level: str = "INFO"
    log_retention_days: int = 30
    versioning: bool = False
    point_in_time_recovery: bool = False
    alarm_email: str | None = None
    # an SNS topic of yours (its ARN) that the alarms publish to as well, beside their own topic
    alarm_topic_arn: str | None = None
    # a production environment refuses to synth with alarms that reach nobody; null: one named `prod` is
    production: bool | None = None
    api_key_secret_arn: str | None = None
    # the provider's webhook signing secret (`whsec_...`); created with a placeholder when null
    webhook_secret_arn: str | None = None
    # the customer managed KMS key that encrypts the imported secrets above, if not aws/secretsmanager
    secrets_kms_key_arn: str | None = None
    # the most requests a minute the provider takes from this environment's key, all models
    # together: the fastest background responses (and so their webhooks) can come
    provider_rpm: int = 30_000
    # the most shards the environment's jobs run at once, all together (`sluice.limits.shard_slots`:
    # a shard beyond it waits in the workflow for a slot), and so the most one job's Map runs; 0 or
    # left out: `derived_shards_in_flight`
    max_shards_in_flight: int = DEPLOYED_DEFAULTS["max_shards_in_flight"]
    # the account's Lambda concurrency quota in the stack's region (1,000 until raised; a new
    # account's may be 10: `aws lambda get-account-settings` says, as AccountLimit.ConcurrentExecutions)
    account_concurrency: int = 1000
    # the webhook function's reserved concurrency: None derives it from provider_rpm
    # (`webhook_concurrency`); 0 reserves none, for an account whose quota cannot hold a reservation
    # beside the 100 Lambda keeps unreserved (webhooks then share the account's concurrency)
    webhook_reserved_concurrency: int | None = None
    # the provider's limits per model, {"gpt-4o-mini": {"rpm": 30000, "tpm": 150000000}}: they seed
    # the shared limit until the provider's x-ratelimit-* headers say otherwise
    rate_limits: Mapping[str, Mapping[str, float]] | None = None
    # prices that override the maintained source's, {"my-finetune": [0.3, 1.2]} (USD per million
    # tokens: input, output, and optionally cached input and cache write), for the budget, the
    # deadline's plan and the summary's cost
    prices: Mapping[str, Sequence[float]] | None = None
    account: str | None = None
    region: str | None = None

    def __post_init__(self) -> None:
        if self.max_shards_in_flight <= 0:
            object.__setattr__(self, "max_shards_in_flight", self.derived_shards_in_flight)

    @property
    def derived_shards_in_flight(self) -> int:
        """The cap of an environment that names none: half the account's concurrency, less what the
        environment reserves, so that its shards at their cap use at most half of the account's
        Lambdas and leave the rest to another environment in the account (1,000: 400 at provider_rpm
        30,000)."""
        return max(1, self.account_concurrency // 2 - self.reserved_concurrency)

    @property
    def in_production(self) -> bool:
        return self.production if self.production is not None else self.name == PRODUCTION_NAME

    @property
    def stack_name(self) -> str:
        return f"Sluice-{self.name}"

    @property
    def cdk_removal_policy(self) -> cdk.RemovalPolicy:
        return REMOVAL_POLICIES[self.removal_policy]

    @property
    def log_retention(self) -> logs.RetentionDays:
        return LOG_RETENTION[self.log_retention_days]

    @property
    def webhook_rate_limit(self) -> int:
        """The webhook endpoint's steady requests a second (API Gateway throttling)."""
        return math.ceil(self.provider_rpm / 60 * WEBHOOK_HEADROOM)

    @property
    def webhook_burst_limit(self) -> int:
        return 2 * self.webhook_rate_limit

    @property
    def webhook_concurrency(self) -> int:
        """The webhook function's reserved concurrency: what its endpoint's rate keeps busy, or
        the environment's `webhook_reserved_concurrency` (0: none)."""
        if self.webhook_reserved_concurrency is not None:
            return self.webhook_reserved_concurrency
        return max(WEBHOOK_MIN_CONCURRENCY, math.ceil(self.webhook_rate_limit * WEBHOOK_INVOCATION_S))

    @property
    def reserved_concurrency(self) -> int:
        """What the environment reserves of the account's concurrency: the webhook's share only.

        A shard runs one of its steps at a time, so a reservation on each of them (five modes'
        steps) would hold five places for every shard that can use one; the shard steps take the
        account's unreserved concurrency, and a throttled one waits and retries in the workflow."""
        return self.webhook_concurrency

    @classmethod
    def from_context(cls, name: str, environments: Mapping[str, Any] | None) -> Environment:
        raw = environment_entry(name, environments)
        check_keys(name, raw, fields(cls))

        def fail(key: str, why: str) -> ConfigError:
            return ConfigError(f"environment {name!r}: {key} {why}, got {raw[key]!r}")

        values = typed_values(dict(raw), fail)
        check_formats(values, fail)
        provider = values.get("provider", DEFAULT_PROVIDER)
        if "provider_base_url" not in values and provider in FAMILY_BASE_URLS:
            values["provider_base_url"] = FAMILY_BASE_URLS[provider]
        # a provider switched in cdk.json with the other family's URL left behind
        other = {url.rstrip("/"): name for name, url in FAMILY_BASE_URLS.items() if name != provider}
        wrong = other.get(str(values.get("provider_base_url", "")).rstrip("/"))
        if wrong:
            right = FAMILY_BASE_URLS.get(provider)
            raise fail("provider_base_url", f"is the {wrong} API, not {provider}'s ({right}, or leave it out)")
        if provider in SIGNED_PROVIDERS and values.get("api_key_secret_arn"):
            raise fail(
                "api_key_secret_arn", f"names a key, but {provider} signs with the functions' roles and has none"
            )
        config = cls(name=name, **values)
        _check_concurrency(config)
        _check_alarms(config)
        return config


def _check_concurrency(config: Environment) -> None:
    """The shards in flight fit the Map's concurrency, and what the environment reserves fits the account."""
    name = config.name
    if config.map_concurrency > config.max_shards_in_flight:
        raise ConfigError(
            f"environment {name!r}: map_concurrency ({config.map_concurrency}) is above max_shards_in_flight "
            f"({config.max_shards_in_flight}); a job would start shards that can only wait for a place"
        )
    reserved = config.reserved_concurrency
    if reserved and config.account_concurrency - UNRESERVED_CONCURRENCY < reserved:
        # CloudFormation would create half the stack, then fail on the webhook function and roll back
        raise ConfigError(
            f"environment {name!r}: the webhook function reserves {reserved} of the account's Lambda "
            f"concurrency, and Lambda keeps {UNRESERVED_CONCURRENCY} unreserved: an account_concurrency of "
            f"{config.account_concurrency} cannot hold it (a new account's quota may be 10; "
            "`aws lambda get-account-settings` shows AccountLimit.ConcurrentExecutions). Ask for a higher "
            "'Concurrent executions' quota (Service Quotas > AWS Lambda) and set account_concurrency to it, "
            "or set webhook_reserved_concurrency to 0 to deploy with no reservation"
        )
    # with nothing reserved Lambda needs no unreserved floor: the shards may take the whole quota
    room = config.account_concurrency - (UNRESERVED_CONCURRENCY if reserved else 0)
    needed = config.max_shards_in_flight + reserved
    if needed > room:
        raise ConfigError(
            f"environment {name!r}: max_shards_in_flight {config.max_shards_in_flight} beside the "
            f"{config.reserved_concurrency} the webhook reserves at provider_rpm {config.provider_rpm} needs "
            f"{needed} concurrent Lambdas, more than the {room} an account_concurrency of "
            f"{config.account_concurrency} leaves (Lambda keeps {UNRESERVED_CONCURRENCY} unreserved); lower "
            "max_shards_in_flight, or raise the account's quota and account_concurrency"
        )


def _check_alarms(config: Environment) -> None:
    """A production environment's alarms reach someone the stack can name."""
    if config.in_production and not (config.alarm_email or config.alarm_topic_arn):
        name = config.name
        why = "is named prod" if config.production is None else 'says "production": true'
        raise ConfigError(
            f"environment {name!r} {why}, and its alarms would reach nobody: set alarm_email in cdk.json "
            f"(context.environments.{name}.alarm_email) to the address that answers them, or alarm_topic_arn "
            f"(context.environments.{name}.alarm_topic_arn) to an SNS topic that someone watches"
        )


# The steps' settings the stack fills in itself: its bucket, table and event bus, and the ARN of
# the API key's secret, which is cdk.json's `api_key_secret_arn` only when that imports one.
STACK_SETTINGS = frozenset({"bucket", "table", "api_key_secret_arn", "event_bus"})
# The fields of Environment that are the steps' own settings: cdk.json sets them per environment,
# and `infra.functions.lambda_environment` hands each one to `Settings` under its own name.
STEP_SETTINGS = tuple(
    f.name for f in fields(Environment) if f.name in {s.name for s in fields(Settings)} - STACK_SETTINGS
)


def stack_instance_id(scope: IConstruct) -> str:
    """12 hex digits unique to this creation of the stack: the end of its CloudFormation stack id.

    Retained resources outlive their stack, so a fixed name would stop the next deployment of the
    environment from creating its own (and Secrets Manager keeps a deleted secret's name for its
    recovery window). A name ending in this is new each time the stack is created, yet known at
    synth, so a policy can name the resource without depending on it.
    """
    guid = cdk.Fn.select(2, cdk.Fn.split("/", cdk.Stack.of(scope).stack_id))
    return cdk.Fn.select(4, cdk.Fn.split("-", guid))


def cdk_json_context(path: Path = CDK_JSON) -> dict[str, Any]:
    """The context in cdk.json, for apps run without the CDK CLI (which would pass it itself)."""
    context = json.loads(path.read_text()).get("context", {})
    if not isinstance(context, dict):
        raise ValueError(f"{path}: context is not an object")
    return context
