"""The Lambda functions: one per state machine step, and the webhook receiver, all from one code asset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_iam as iam
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_secretsmanager as secretsmanager
from constructs import Construct
from sluice.contract import (
    ENVIRONMENT_VARIABLE,
    METRICS_NAMESPACE,
    NO_API_KEY_SECRET,
    SERVICE,
    STEPS,
    WEBHOOK,
    Settings,
    Step,
    WebhookSettings,
    bedrock_job_name_prefix,
    queue_tokens_text,
    variables_read,
)

from infra.bundling import lambda_code
from infra.config import STEP_SETTINGS, Environment

FUNCTIONS_DIR = Path(__file__).resolve().parent.parent / "functions"

# Completion events go to the account's default bus, where users' own rules can see them.
EVENT_BUS = "default"

# boto3's standard retry mode: throttling (DynamoDB, S3 SlowDown, Step Functions) and 5xx answers
# are retried with jittered backoff up to 5 attempts; what outlasts that fails the step as
# `Transient`, and the state machine retries it (`sluice.contract.definition.TRANSIENT_LAMBDA_ERRORS`).
SDK_RETRY_ENVIRONMENT = {"AWS_RETRY_MODE": "standard", "AWS_MAX_ATTEMPTS": "5"}


def powertools_environment(config: Environment) -> dict[str, str]:
    """What aws-lambda-powertools reads (service, log level, metrics, tracer), the env, and boto3's retries."""
    return {
        "POWERTOOLS_SERVICE_NAME": SERVICE,
        "POWERTOOLS_LOG_LEVEL": config.log_level,
        "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
        # the `environment` dimension of every metric, so that two deployments never mix
        ENVIRONMENT_VARIABLE: config.name,
        # a step's answer is the workflow's state: job ids and counts, but no place for traces
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE": "false",
        **SDK_RETRY_ENVIRONMENT,
    }


def lambda_environment(
    config: Environment, *, bucket: s3.IBucket, table: dynamodb.ITable, api_key: secretsmanager.ISecret | None
) -> dict[str, str]:
    """Every step's `Settings`, as the variables they read them from (`step_environment` gives each
    function its share); the key travels as an ARN only, and a provider that signs its requests has
    none (`NO_API_KEY_SECRET`)."""
    chosen: dict[str, Any] = {name: getattr(config, name) for name in STEP_SETTINGS}
    # cdk.json writes these four as JSON (and a budget of null), the steps read them as text
    chosen.update(
        batch_queue_tokens=queue_tokens_text(config.batch_queue_tokens),
        budget_usd=config.budget_usd or 0.0,
        rate_limits=json.dumps(config.rate_limits, sort_keys=True) if config.rate_limits else None,
        prices=json.dumps(config.prices, sort_keys=True) if config.prices else None,
    )
    settings = Settings(
        bucket=bucket.bucket_name,
        table=table.table_name,
        api_key_secret_arn=api_key.secret_arn if api_key is not None else NO_API_KEY_SECRET,
        event_bus=EVENT_BUS,
        bedrock_job_prefix=bedrock_job_name_prefix(config.name),
        **chosen,
    )
    return {**settings.to_env(), **powertools_environment(config)}


def step_environment(environment: dict[str, str], step: str) -> dict[str, str]:
    """A step's function's share of `environment`: only the settings sets its step reads
    (`sluice.contract.step_settings`), and Powertools' and boto3's variables."""
    settings = Settings.variables()
    read = variables_read(step)
    return {name: value for name, value in environment.items() if name in read or name not in settings}


def webhook_environment(
    config: Environment, *, table: dynamodb.ITable, webhook_secret: secretsmanager.ISecret
) -> dict[str, str]:
    """What `sluice_handlers.webhook` reads: no bucket, no provider, no API key."""
    settings = WebhookSettings(
        table=table.table_name, webhook_secret_arn=webhook_secret.secret_arn, ttl_days=config.ttl_days
    )
    return {**settings.to_env(), **powertools_environment(config)}


class Functions(Construct):
    """Roles start empty: the stack grants each one exactly what its step needs.

    Only the webhook receiver reserves concurrency, what its endpoint's rate needs, so shards can
    never starve it. The shard steps reserve none: a shard runs one of its five steps at a time, so
    a reservation each would hold five places for every shard that uses one. A job's shards in flight
    are its Map's MaxConcurrency; jobs at once share the account's concurrency, and a throttled
    shard step waits and retries in the workflow.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: Environment,
        bucket: s3.IBucket,
        table: dynamodb.ITable,
        api_key: secretsmanager.ISecret | None,
        webhook_secret: secretsmanager.ISecret,
        source: Path = FUNCTIONS_DIR,
    ) -> None:
        super().__init__(scope, id)
        environment = lambda_environment(config, bucket=bucket, table=table, api_key=api_key)
        self.code = lambda_code(source)
        self.by_step: dict[str, lambda_.Function] = {}
        self.log_groups: dict[str, logs.LogGroup] = {}
        for step in STEPS.values():
            self.by_step[step.name] = self._function(
                config, step, step_environment(environment, step.name), f"Sluice {step.name} step", reserved=None
            )

        # Kept out of `by_step`: the state machine's definition neither has nor invokes it.
        self.webhook = self._function(
            config,
            WEBHOOK,
            webhook_environment(config, table=table, webhook_secret=webhook_secret),
            "Sluice webhook receiver: verifies provider webhooks and settles items",
            # 0: the environment reserves none (a reservation of 0 would throttle every webhook)
            reserved=config.webhook_concurrency or None,
        )

    def _function(
        self, config: Environment, step: Step, environment: dict[str, str], description: str, *, reserved: int | None
    ) -> lambda_.Function:
        name = step.construct_id
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
        self.log_groups[step.name] = log_group
        return lambda_.Function(
            self,
            name,
            runtime=lambda_.Runtime.PYTHON_3_12,
            architecture=lambda_.Architecture.X86_64,
            code=self.code,
            handler=step.handler,
            timeout=cdk.Duration.seconds(step.timeout_s),
            memory_size=step.memory_mb,
            role=role,
            log_group=log_group,
            environment=environment,
            description=description,
            tracing=lambda_.Tracing.ACTIVE,
            reserved_concurrent_executions=reserved,
        )
