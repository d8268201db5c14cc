"""An environment's entry in cdk.json checked value by value, before `infra.config.Environment` is
made of it: the environment's name, no retired or unknown key, each value of its type and range,
and the ARNs and addresses in their formats. A failure is a `ConfigError` that names the key."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field
from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
from sluice.contract import (
    DEFAULT_PROVIDER,
    MODES,
    PROVIDERS,
    SETTING_DEFAULTS,
    parse_prices,
    parse_rate_limits,
    parse_validate,
)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_RETENTION = {
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    90: logs.RetentionDays.THREE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
}
REMOVAL_POLICIES = {"destroy": cdk.RemovalPolicy.DESTROY, "retain": cdk.RemovalPolicy.RETAIN}

# A complete ARN ends in the six random characters Secrets Manager appends; IAM policies need it
# (or a `-??????` wildcard), so a partial ARN would silently grant nothing.
_SECRET_ARN = re.compile(r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:.+-[A-Za-z0-9]{6}$")
# A key ARN, not an alias: IAM matches kms:Decrypt against the key's own ARN.
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+$")
_SNS_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_ENV_NAME = re.compile(r"^[a-z][a-z0-9-]{0,19}$")
# Keys cdk.json no longer takes, and what took their place.
_RETIRED = {
    "webhook_rate_limit": "the webhook endpoint's throttle is derived from provider_rpm",
    "webhook_burst_limit": "the webhook endpoint's throttle is derived from provider_rpm",
}


# A new on-demand table's warm throughput, writes and reads a second, and the table-level quota a
# pre-warmed one stays within (docs.aws.amazon.com/amazondynamodb/latest/developerguide/warm-throughput-scenarios.html)
NEW_TABLE_WARM_WRITES = 4_000
NEW_TABLE_WARM_READS = 12_000
TABLE_UNITS_MAX = 40_000


class ConfigError(ValueError):
    pass


Fail = Callable[[str, str], ConfigError]


def environment_entry(name: str, environments: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """cdk.json's entry for the environment `name`, which names resources."""
    if not environments:
        raise ConfigError("cdk.json has no `environments` context")
    if name not in environments:
        known = ", ".join(sorted(environments))
        raise ConfigError(f"unknown environment {name!r}; cdk.json defines: {known}")
    raw = environments[name]
    if not isinstance(raw, Mapping):
        raise ConfigError(f"environment {name!r}: expected an object, got {type(raw).__name__}")
    if not _ENV_NAME.match(name):
        raise ConfigError(
            f"environment {name!r}: name must be lowercase letters, digits and '-' (max 20),"
            " since it is part of resource names"
        )
    return raw


def check_keys(name: str, raw: Mapping[str, Any], declared: tuple[Field[Any], ...]) -> None:
    """No retired or unknown key, and every required one."""
    known_keys = {f.name for f in declared} - {"name"}
    retired = sorted(set(raw) & set(_RETIRED))
    if retired:
        raise ConfigError(f"environment {name!r}: {retired[0]} is no longer a setting: {_RETIRED[retired[0]]}")
    unknown = sorted(set(raw) - known_keys)
    if unknown:
        raise ConfigError(f"environment {name!r}: unknown key(s) {', '.join(unknown)}")
    for f in declared:
        if f.name != "name" and f.name not in raw and f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"environment {name!r}: missing required key {f.name!r}")


def typed_values(values: dict[str, Any], fail: Fail) -> dict[str, Any]:
    """Each value of the type its field holds: numbers in range, as floats where a float is meant."""
    for key in (
        "concurrency",
        "map_concurrency",
        "shard_lines",
        "ttl_days",
        "cache_ttl_days",
        "poll_seconds",
        "log_retention_days",
        "provider_rpm",
        "max_shards_in_flight",
        "account_concurrency",
        "validate_attempts",
        "bedrock_batch_jobs_quota",
    ):
        if key in values and (type(values[key]) is not int or values[key] <= 0):
            raise fail(key, "must be a positive integer")
    reservation = values.get("webhook_reserved_concurrency")
    if reservation is not None and (type(reservation) is not int or reservation < 0):
        raise fail("webhook_reserved_concurrency", "must be a whole number (0 reserves none), or null")
    if "validate" in values:
        checks = values["validate"]
        problem = None if isinstance(checks, str) else "not a string"
        if problem is None:
            try:
                parse_validate(checks)
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            raise fail("validate", f"must be all, or names of checks separated by commas ({problem})")
    if values.get("validate_repair", "off") not in ("on", "off"):
        raise fail("validate_repair", "must be on or off")
    if "batch_queue_tokens" in values:
        limits = values["batch_queue_tokens"]
        if not isinstance(limits, Mapping) or not all(
            isinstance(model, str) and model and "," not in model and type(tokens) is int and tokens >= 0
            for model, tokens in limits.items()
        ):
            raise fail("batch_queue_tokens", "must map model names to whole numbers of tokens (0 = no limit)")
        values["batch_queue_tokens"] = dict(limits)
    for key, least in (
        ("table_warm_writes_per_s", NEW_TABLE_WARM_WRITES),
        ("table_warm_reads_per_s", NEW_TABLE_WARM_READS),
    ):
        if key in values and (
            type(values[key]) is not int or (values[key] and not least < values[key] <= TABLE_UNITS_MAX)
        ):
            raise fail(
                key, f"must be 0 (a new table's) or a whole number above {least:,} and at most {TABLE_UNITS_MAX:,}"
            )
    if "max_attempts" in values and (type(values["max_attempts"]) is not int or values["max_attempts"] < 0):
        raise fail("max_attempts", "must be a whole number of sends (0 = as the job needs)")
    if "batch_queue_default_tokens" in values and (
        type(values["batch_queue_default_tokens"]) is not int or values["batch_queue_default_tokens"] < 0
    ):
        raise fail("batch_queue_default_tokens", "must be a whole number of tokens (0 = no limit)")
    for key in ("request_timeout_s", "safety_margin_s"):
        if key in values:
            if type(values[key]) not in (int, float) or values[key] <= 0:
                raise fail(key, "must be a positive number")
            values[key] = float(values[key])
    if "max_error_rate" in values:
        rate = values["max_error_rate"]
        if type(rate) not in (int, float) or not 0 <= rate <= 1:
            raise fail("max_error_rate", "must be a number from 0 to 1 (0.01 = 1%)")
        values["max_error_rate"] = float(rate)
    if values.get("budget_usd") is not None:
        budget = values["budget_usd"]
        if type(budget) not in (int, float) or not 0 <= budget < float("inf"):
            raise fail("budget_usd", "must be an amount of US dollars, 0 or null for no cap")
        values["budget_usd"] = float(budget)
    for key in ("versioning", "point_in_time_recovery"):
        if key in values and type(values[key]) is not bool:
            raise fail(key, "must be true or false")
    if values.get("production") is not None and type(values["production"]) is not bool:
        raise fail("production", "must be true, false or null (null: only an environment named prod)")
    for key in ("provider", "provider_base_url", "default_mode", "log_level", "removal_policy"):
        if key in values and not isinstance(values[key], str):
            raise fail(key, "must be a string")
    for key in (
        "default_model",
        "alarm_email",
        "alarm_topic_arn",
        "api_key_secret_arn",
        "webhook_secret_arn",
        "secrets_kms_key_arn",
        "account",
        "region",
    ):
        if values.get(key) is not None and (not isinstance(values[key], str) or not values[key]):
            raise fail(key, "must be a non-empty string or null")
    return values


def check_formats(values: Mapping[str, Any], fail: Fail) -> None:
    """Each string in its form: URLs, choices, email, ARNs, account id, rate limits, log retention."""
    if "provider_base_url" in values and not re.match(r"^https?://\S+$", values["provider_base_url"]):
        raise fail("provider_base_url", "must be an http(s) URL")
    if values.get("provider", DEFAULT_PROVIDER) not in PROVIDERS:
        raise fail("provider", f"must be one of {', '.join(PROVIDERS)}")
    if values.get("default_mode", SETTING_DEFAULTS["default_mode"]) not in MODES:
        raise fail("default_mode", f"must be one of {', '.join(MODES)}")
    if values.get("log_level", "INFO") not in LOG_LEVELS:
        raise fail("log_level", f"must be one of {', '.join(LOG_LEVELS)}")
    if values["removal_policy"] not in REMOVAL_POLICIES:
        raise fail("removal_policy", f"must be one of {', '.join(REMOVAL_POLICIES)}")
    if values.get("alarm_email") and not _EMAIL.match(values["alarm_email"]):
        raise fail("alarm_email", "must be an email address")
    if values.get("alarm_topic_arn") and not _SNS_TOPIC_ARN.match(values["alarm_topic_arn"]):
        raise fail("alarm_topic_arn", "must be the ARN of an SNS topic (arn:aws:sns:<region>:<account>:<name>)")
    for key in ("api_key_secret_arn", "webhook_secret_arn"):
        if values.get(key) and not _SECRET_ARN.match(values[key]):
            raise fail(key, "must be the complete ARN of a Secrets Manager secret")
    if values.get("secrets_kms_key_arn"):
        if not _KMS_KEY_ARN.match(values["secrets_kms_key_arn"]):
            raise fail("secrets_kms_key_arn", "must be the ARN of a KMS key (arn:...:kms:<region>:<account>:key/...)")
        if not (values.get("api_key_secret_arn") or values.get("webhook_secret_arn")):
            raise fail(
                "secrets_kms_key_arn",
                "applies only to imported secrets (api_key_secret_arn, webhook_secret_arn); the secrets the stack"
                " creates use aws/secretsmanager",
            )
    if values.get("rate_limits") is not None:
        try:
            parse_rate_limits(json.dumps(values["rate_limits"]))
        except (ValueError, TypeError) as exc:
            raise fail("rate_limits", f"must be an object of models ({exc})") from None
    if values.get("prices") is not None:
        try:
            parse_prices(json.dumps(values["prices"]))
        except (ValueError, TypeError) as exc:
            raise fail("prices", f"must be an object of models ({exc})") from None
    if values.get("account") and not re.match(r"^\d{12}$", values["account"]):
        raise fail("account", "must be a 12-digit AWS account id")
    if "log_retention_days" in values and values["log_retention_days"] not in LOG_RETENTION:
        raise fail("log_retention_days", f"must be one of {', '.join(map(str, LOG_RETENTION))}")
