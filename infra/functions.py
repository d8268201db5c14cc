"""The Lambda functions: one per state machine step, and the webhook receiver, all from one code asset."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import aws_cdk as cdk
import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_iam as iam
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_secretsmanager as secretsmanager
from constructs import Construct

from infra.bundling import LocalBundling
from infra.config import Environment
from infra.definition import FUNCTION_PLACEHOLDERS

FUNCTIONS_DIR = Path(__file__).resolve().parent.parent / "functions"

# A shard Lambda drives hundreds of sockets and parses every response; 1769 MB is the size at
# which Lambda gives a full vCPU.
FULL_VCPU_MB = 1769

# Completion events go to the account's default bus, where users' own rules can see them.
EVENT_BUS = "default"


@dataclass(frozen=True)
class Step:
    handler: str
    timeout: cdk.Duration
    memory_mb: int = 1024


# One per `infra.definition.FUNCTION_PLACEHOLDERS`. Steps that work through a shard get
# Lambda's maximum so that they can drain and checkpoint before the workflow loops them.
STEPS = {
    # Plan holds every custom_id to find duplicates, ~142 bytes a line: 1.4 GB at 10M lines
    "plan": Step("handlers.plan.handler", cdk.Duration.minutes(15), 3008),
    "run_shard": Step("handlers.run_shard.handler", cdk.Duration.minutes(15), FULL_VCPU_MB),
    "submit": Step("handlers.submit.handler", cdk.Duration.minutes(15)),
    "await_shard": Step("handlers.await_shard.handler", cdk.Duration.seconds(30)),
    "collect": Step("handlers.collect.handler", cdk.Duration.minutes(15)),
    "submit_batch": Step("handlers.submit_batch.handler", cdk.Duration.minutes(15)),
    "collect_batch": Step("handlers.collect_batch.handler", cdk.Duration.minutes(15)),
    "merge": Step("handlers.merge.handler", cdk.Duration.minutes(15)),
    "notify": Step("handlers.notify.handler", cdk.Duration.seconds(30)),
    "mark_failed": Step("handlers.mark_failed.handler", cdk.Duration.minutes(15)),
}

# Not a step of the state machine: API Gateway calls it for each provider webhook. It answers
# within a second or two (API Gateway gives up at 30 s, providers sooner); 512 MB buys the CPU
# for a quick cold start.
WEBHOOK = Step("handlers.webhook.handler", cdk.Duration.seconds(10), 512)

# Mirrors `handlers.observability.NAMESPACE` and `SERVICE`, the EMF namespace and service dimension.
METRICS_NAMESPACE = "Sluice"
SERVICE_NAME = "sluice"


# boto3's standard retry mode: throttling (DynamoDB, S3 SlowDown, Step Functions) and 5xx answers
# are retried with jittered backoff up to 5 attempts; what outlasts that fails the step as
# `Transient`, and the state machine retries it (`infra.definition.TRANSIENT_LAMBDA_ERRORS`).
SDK_RETRY_ENVIRONMENT = {"AWS_RETRY_MODE": "standard", "AWS_MAX_ATTEMPTS": "5"}


def powertools_environment(config: Environment) -> dict[str, str]:
    """What aws-lambda-powertools reads (service, log level, metrics, tracer), the env, and boto3's retries."""
    return {
        "POWERTOOLS_SERVICE_NAME": SERVICE_NAME,
        "POWERTOOLS_LOG_LEVEL": config.log_level,
        "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        # the `environment` dimension of every metric, so that two deployments never mix
        "SLUICE_ENV": config.name,
        # a step's answer is the workflow's state: job ids and counts, but no place for traces
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
        **SDK_RETRY_ENVIRONMENT,
    }


def lambda_environment(
    config: Environment, *, bucket: s3.IBucket, table: dynamodb.ITable, api_key: secretsmanager.ISecret
) -> dict[str, str]:
    """The variables `sluice.settings.Settings.from_env` reads; the key travels as an ARN only."""
    return {
        "SLUICE_BUCKET": bucket.bucket_name,
        "SLUICE_TABLE": table.table_name,
        "SLUICE_PROVIDER_BASE_URL": config.provider_base_url,
        "SLUICE_API_KEY_SECRET_ARN": api_key.secret_arn,
        "SLUICE_DEFAULT_MODE": config.default_mode,
        "SLUICE_CONCURRENCY": str(config.concurrency),
        "SLUICE_MAP_CONCURRENCY": str(config.map_concurrency),
        "SLUICE_MAX_ATTEMPTS": str(config.max_attempts),
        "SLUICE_REQUEST_TIMEOUT_S": str(config.request_timeout_s),
        "SLUICE_SHARD_LINES": str(config.shard_lines),
        "SLUICE_TTL_DAYS": str(config.ttl_days),
        "SLUICE_EVENT_BUS": EVENT_BUS,
        "SLUICE_POLL_SECONDS": str(config.poll_seconds),
        "SLUICE_SAFETY_MARGIN_S": str(config.safety_margin_s),
        "SLUICE_MAX_ERROR_RATE": str(config.max_error_rate),
        **powertools_environment(config),
    }


def webhook_environment(
    config: Environment, *, table: dynamodb.ITable, webhook_secret: secretsmanager.ISecret
) -> dict[str, str]:
    """What `handlers.webhook` reads: no bucket, no provider, no API key."""
    return {
        "SLUICE_TABLE": table.table_name,
        "SLUICE_WEBHOOK_SECRET_ARN": webhook_secret.secret_arn,
        "SLUICE_TTL_DAYS": str(config.ttl_days),
        **powertools_environment(config),
    }


def _construct_id(step: str) -> str:
    return "".join(part.title() for part in step.split("_"))


class Functions(Construct):
    """Roles start empty: the stack grants each one exactly what its step needs."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: Environment,
        bucket: s3.IBucket,
        table: dynamodb.ITable,
        api_key: secretsmanager.ISecret,
        webhook_secret: secretsmanager.ISecret,
        source: Path = FUNCTIONS_DIR,
    ) -> None:
        super().__init__(scope, id)
        if set(STEPS) != set(FUNCTION_PLACEHOLDERS):
            raise ValueError(
                "infra/functions.py STEPS and infra/definition.py FUNCTION_PLACEHOLDERS disagree: "
                f"no function for {sorted(set(FUNCTION_PLACEHOLDERS) - set(STEPS))}, "
                f"no step for {sorted(set(STEPS) - set(FUNCTION_PLACEHOLDERS))}"
            )
        environment = lambda_environment(config, bucket=bucket, table=table, api_key=api_key)
        self.code = lambda_.Code.from_asset(
            str(source),
            exclude=["__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", "tests"],
            bundling=cdk.BundlingOptions(
                image=cdk.DockerImage.from_registry("unused"),
                # jsii.implements makes it an ILocalBundling at runtime; mypy cannot tell.
                local=cast(cdk.ILocalBundling, LocalBundling(source=source)),
            ),
        )
        self.by_step: dict[str, lambda_.Function] = {}
        self.log_groups: dict[str, logs.LogGroup] = {}
        for step, spec in STEPS.items():
            self.by_step[step] = self._function(config, step, spec, environment, f"Sluice {step} step")

        # Kept out of `by_step`: the state machine's definition neither has nor invokes it.
        self.webhook = self._function(
            config,
            "webhook",
            WEBHOOK,
            webhook_environment(config, table=table, webhook_secret=webhook_secret),
            "Sluice webhook receiver: verifies provider webhooks and settles items",
        )

        self.plan = self.by_step["plan"]
        self.run_shard = self.by_step["run_shard"]
        self.submit = self.by_step["submit"]
        self.await_shard = self.by_step["await_shard"]
        self.collect = self.by_step["collect"]
        self.submit_batch = self.by_step["submit_batch"]
        self.collect_batch = self.by_step["collect_batch"]
        self.merge = self.by_step["merge"]
        self.notify = self.by_step["notify"]
        self.mark_failed = self.by_step["mark_failed"]

    def _function(
        self, config: Environment, step: str, spec: Step, environment: dict[str, str], description: str
    ) -> lambda_.Function:
        name = _construct_id(step)
        log_group = logs.LogGroup(
            self,
            f"{name}Logs",
            retention=config.log_retention,
            removal_policy=config.cdk_removal_policy,
        )
        role = iam.Role(
            self,
            f"{name}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=description,
        )
        self.log_groups[step] = log_group
        return lambda_.Function(
            self,
            name,
            runtime=lambda_.Runtime.PYTHON_3_12,
            architecture=lambda_.Architecture.X86_64,
            code=self.code,
            handler=spec.handler,
            timeout=spec.timeout,
            memory_size=spec.memory_mb,
            role=role,
            log_group=log_group,
            environment=environment,
            description=description,
            tracing=lambda_.Tracing.ACTIVE,
        )
