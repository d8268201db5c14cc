"""One Sluice environment: the constructs, and every permission between them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
from constructs import Construct
from sluice.contract import (
    BEDROCK_PROVIDER,
    JOBS_PREFIX,
    PROVIDER_ID_INDEX,
    SIGNED_PROVIDERS,
)

from infra.bedrock_batch import BedrockBatch, grant_bedrock_batch, grant_bedrock_invoke
from infra.cdk_logs import CdkLogs, cdk_functions
from infra.checks import acknowledge, acknowledge_actions
from infra.config import Environment
from infra.config_values import ConfigError
from infra.functions import Functions
from infra.grants import Grants
from infra.monitoring import Monitoring
from infra.secrets import Secrets
from infra.step_grants import CALLBACK_REASON, grant_steps
from infra.storage import Storage
from infra.table_access import INDEX_ACTIONS, TABLE_ACTIONS
from infra.webhooks import Webhooks
from infra.workflow import Workflow

# `-c without_provider_index=true`: deploy once without the provider-id index, to change how it
# is built (docs/deploy.md); webhooks for batches fail meanwhile, and polling finishes the shards.
WITHOUT_PROVIDER_INDEX = "without_provider_index"
# What the webhook Lambda does to the table, and to the index that finds a shard by its provider
# id; a test runs the handler and checks that it calls nothing else.
WEBHOOK_TABLE_ACTIONS = TABLE_ACTIONS["webhook"]
WEBHOOK_INDEX_ACTIONS = INDEX_ACTIONS["webhook"]

# Actions CDK grants for features we turn on, which support no resource-level permission.
TRACING_ACTIONS = ("xray:PutTraceSegments", "xray:PutTelemetryRecords")
TRACING_REASON = "Active tracing: X-Ray's PutTraceSegments and PutTelemetryRecords support no resource-level grant."
WORKFLOW_LOG_ACTIONS = (
    "logs:CreateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:DescribeLogGroups",
    "logs:DescribeResourcePolicies",
    "logs:GetLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:UpdateLogDelivery",
)
WORKFLOW_TRACING_ACTIONS = ("xray:GetSamplingRules", "xray:GetSamplingTargets", *TRACING_ACTIONS)


class SluiceStack(cdk.Stack):
    def __init__(self, scope: Construct, id: str, *, config: Environment, **kwargs: Any) -> None:
        super().__init__(scope, id, **kwargs)
        self.config = config
        removal = config.cdk_removal_policy

        self.storage = Storage(
            self,
            "Storage",
            ttl_days=config.ttl_days,
            cache_ttl_days=config.cache_ttl_days,
            versioned=config.versioning,
            point_in_time_recovery=config.point_in_time_recovery,
            removal_policy=removal,
            provider_index=not self.node.try_get_context(WITHOUT_PROVIDER_INDEX),
            warm_writes_per_s=config.table_warm_writes_per_s,
            warm_reads_per_s=config.table_warm_reads_per_s,
        )
        self.secrets = Secrets(
            self,
            "Secrets",
            env_name=config.name,
            api_key_secret_arn=config.api_key_secret_arn,
            webhook_secret_arn=config.webhook_secret_arn,
            removal_policy=removal,
            api_key_needed=config.provider not in SIGNED_PROVIDERS,
        )
        self.functions = Functions(
            self,
            "Functions",
            config=config,
            bucket=self.storage.bucket,
            table=self.storage.table,
            api_key=self.secrets.api_key,
            webhook_secret=self.secrets.webhook_secret,
        )
        self.workflow = Workflow(
            self,
            "Workflow",
            env_name=config.name,
            bucket=self.storage.bucket,
            functions=self.functions.by_step,
            log_retention=config.log_retention,
            removal_policy=removal,
        )
        self.webhooks = Webhooks(
            self,
            "Webhooks",
            env_name=config.name,
            function=self.functions.webhook,
            rate_limit=config.webhook_rate_limit,
            burst_limit=config.webhook_burst_limit,
            log_retention=config.log_retention,
            removal_policy=removal,
        )
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            env_name=config.name,
            state_machine=self.workflow.state_machine,
            functions={**self.functions.by_step, "webhook": self.functions.webhook},
            dead_letter_queue=self.workflow.dead_letter_queue,
            alarm_email=config.alarm_email,
            alarm_topic_arn=config.alarm_topic_arn,
            removal_policy=removal,
            webhook_api=self.webhooks.api,
            table=self.storage.table,
            table_indexes=self.storage.indexes,
        )

        # Bedrock's batch inference (its service role and the rule hearing its jobs) only where jobs go to Bedrock
        self.bedrock_batch = (
            BedrockBatch(self, "BedrockBatch", env_name=config.name, wakes=self.functions.webhook)
            if config.provider == BEDROCK_PROVIDER
            else None
        )

        self.grants = Grants(
            self,
            bucket=self.storage.bucket,
            by_step=self.functions.by_step,
            secrets_kms_key_arn=config.secrets_kms_key_arn,
        )
        self._permissions()
        # last, once every construct that brings one of CDK's own Lambdas exists
        self.cdk_logs = CdkLogs(
            self,
            "CdkLogs",
            functions=cdk_functions(self, [*self.functions.by_step.values(), self.functions.webhook]),
            retention=config.log_retention,
            removal_policy=removal,
        )

        self._outputs()
        cdk.Tags.of(self).add("project", "sluice")
        cdk.Tags.of(self).add("sluice:env", config.name)

    def _permissions(self) -> None:
        """Every permission between the constructs, and the cdk-nag findings acknowledged with why."""
        grant_steps(self.grants, functions=self.functions, table=self.storage.table, secrets=self.secrets)
        self._grant_webhook()
        self._grant_workflow()
        self._grant_monitoring()
        if self.bedrock_batch is not None:
            grant_bedrock_invoke(self.grants, self.bedrock_batch)
            grant_bedrock_batch(self.grants, self.bedrock_batch)
        self._acknowledge_nag_findings()

    def _outputs(self) -> None:
        """What `sluice submit`, `status` and the operator read of the stack, and the webhook URL to register."""
        cdk.CfnOutput(self, "BucketName", value=self.storage.bucket.bucket_name)
        cdk.CfnOutput(self, "TableName", value=self.storage.table.table_name)
        cdk.CfnOutput(self, "StateMachineArn", value=self.workflow.state_machine.state_machine_arn)
        if self.secrets.api_key is not None:
            cdk.CfnOutput(self, "ApiKeySecretArn", value=self.secrets.api_key.secret_arn)
        cdk.CfnOutput(self, "Provider", value=self.config.provider, description="The provider family jobs go to.")
        cdk.CfnOutput(
            self,
            "WebhookUrl",
            value=self.webhooks.url,
            description="Register this endpoint with the provider for response.* and batch.* events.",
        )
        cdk.CfnOutput(self, "WebhookSecretArn", value=self.secrets.webhook_secret.secret_arn)

    def _grant_webhook(self) -> None:
        """The webhook Lambda: its log group, its items and shards, its secret, and task tokens."""
        function = self.functions.webhook
        role = function.role
        assert role is not None
        self.functions.log_groups["webhook"].grant_write(function)
        table = self.storage.table
        self.grants.allow(role, list(WEBHOOK_TABLE_ACTIONS), [table.table_arn])
        self.grants.allow(role, list(WEBHOOK_INDEX_ACTIONS), [f"{table.table_arn}/index/{PROVIDER_ID_INDEX}"])
        self.grants.allow(role, ["secretsmanager:GetSecretValue"], [self.secrets.webhook_secret.secret_arn])
        if not self.secrets.webhook_secret_created:
            self.grants.allow_secret_decrypt(role, self.secrets.webhook_secret.secret_arn)
        self.grants.allow(role, ["states:SendTaskSuccess"], ["*"], wildcard_reason=CALLBACK_REASON)

    def _grant_workflow(self) -> None:
        workflow = self.workflow
        # The definition names each function by its unqualified ARN (`lambda:invoke` runs $LATEST),
        # and IAM matches that ARN alone: no version or alias (`<arn>:*`) is ever invoked.
        # https://docs.aws.amazon.com/lambda/latest/dg/lambda-api-permissions-ref.html
        self.grants.allow(
            workflow.role, ["lambda:InvokeFunction"], [f.function_arn for f in self.functions.by_step.values()]
        )
        # The Distributed Map's ItemReader reads the manifest that Plan wrote.
        self.grants.allow(
            workflow.role,
            ["s3:GetObject"],
            self.grants.objects(JOBS_PREFIX),
            wildcard_reason="Each job's manifest is under jobs/<job id>/, which exists only once the job runs.",
        )
        # The Distributed Map runs each shard as a child execution of this same state machine;
        # RedriveExecution lets a failed Map run be redriven.
        self.grants.allow(workflow.role, ["states:StartExecution"], [workflow.state_machine_arn])
        self.grants.allow(
            workflow.role,
            ["states:DescribeExecution", "states:StopExecution", "states:RedriveExecution"],
            workflow.execution_arns,
            wildcard_reason="The Map's child executions of this state machine, named only when they start.",
        )
        acknowledge_actions(
            workflow.role,
            WORKFLOW_LOG_ACTIONS,
            "Step Functions' log delivery to CloudWatch Logs, which CDK grants: these actions support no "
            "resource-level permission.",
        )
        acknowledge_actions(workflow.role, WORKFLOW_TRACING_ACTIONS, TRACING_REASON)

    def _grant_monitoring(self) -> None:
        """CloudWatch may publish to the alarm topic, and use its key, for this account's alarms only.

        Without the topic statement every alarm action is refused. The conditions keep another
        account's alarms (the confused deputy) from publishing here. The key cannot name the alarms
        (they depend on the topic, which depends on the key), so both statements name the
        account's alarms in this region by pattern, and say the same.
        """
        monitoring = self.monitoring
        cloudwatch = iam.ServicePrincipal("cloudwatch.amazonaws.com")
        alarms = self.format_arn(
            service="cloudwatch", resource="alarm", resource_name="*", arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME
        )
        conditions = {"StringEquals": {"aws:SourceAccount": self.account}, "ArnLike": {"aws:SourceArn": alarms}}
        monitoring.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsPublish",
                principals=[cloudwatch],
                actions=["sns:Publish"],
                resources=[monitoring.topic.topic_arn],
                conditions=conditions,
            )
        )
        monitoring.topic_key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsUseKey",
                principals=[cloudwatch],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions=conditions,
            )
        )

    def _acknowledge_nag_findings(self) -> None:
        """Deliberate cdk-nag findings that are not about a grant made above."""
        for function in [*self.functions.by_step.values(), self.functions.webhook]:
            acknowledge(
                function,
                "AwsSolutions-L1",
                "Pinned to Python 3.12, the runtime the handlers and their bundled wheels are built for.",
            )
            assert function.role is not None
            acknowledge_actions(function.role, TRACING_ACTIONS, TRACING_REASON)
        acknowledge(
            self.workflow.state_machine,
            "AwsSolutions-SF1",
            "A Distributed Map runs thousands of child executions, so logging ALL events costs more than the "
            "work; ERROR level without execution data also keeps request bodies out of the logs.",
        )
        acknowledge(
            self.workflow.dead_letter_queue,
            "AwsSolutions-SQS3",
            "This queue is itself the dead-letter queue of the EventBridge rule.",
        )
        if self.secrets.created and self.secrets.api_key is not None:
            acknowledge(
                self.secrets.api_key,
                "AwsSolutions-SMG4",
                "A provider API key is issued and rotated at the provider, which Secrets Manager cannot call.",
            )
        if self.secrets.webhook_secret_created:
            acknowledge(
                self.secrets.webhook_secret,
                "AwsSolutions-SMG4",
                "The webhook signing secret is issued and rotated in the provider's dashboard, which Secrets "
                "Manager cannot call; the Lambda re-reads it every few minutes, so a new value takes effect.",
            )
        acknowledge(
            self.webhooks.route,
            "AwsSolutions-APIG4",
            "The webhook signature is the authorization: the provider signs each delivery (Standard Webhooks, "
            "HMAC-SHA256 over id, timestamp and body, with a shared whsec_ secret), and the Lambda verifies it, "
            "with a 5-minute tolerance, before it reads or changes anything. Providers cannot send IAM, Cognito "
            "or JWT credentials; unsigned requests get a 4xx and change nothing.",
        )
        if not self.config.point_in_time_recovery:
            acknowledge(
                self.storage.table,
                "AwsSolutions-DDB3",
                "Job state can be rebuilt by uploading the input again; environments that need PITR enable it.",
            )
        for child in self.node.children:
            # The singleton Lambda behind `event_bridge_enabled`, created and owned by CDK.
            if child.node.id.startswith("BucketNotificationsHandler"):
                acknowledge(
                    child,
                    "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                    "AWSLambdaBasicExecutionRole]",
                    "CDK's own handler that turns on EventBridge notifications for the bucket at deploy time.",
                )


def build_app(app: cdk.App, env_names: Sequence[str] | None = None) -> dict[str, SluiceStack]:
    """Adds one stack per environment: those named, else `-c env=...`, else all in cdk.json."""
    environments = app.node.try_get_context("environments")
    if not environments:
        raise ConfigError("no `environments` in the app's context; is cdk.json next to app.py?")
    if env_names is None:
        selected = app.node.try_get_context("env")
        env_names = [selected] if selected else list(environments)
    stacks = {}
    for name in env_names:
        config = Environment.from_context(name, environments)
        stacks[name] = SluiceStack(
            app,
            config.stack_name,
            config=config,
            description=f"Sluice {name}: batch LLM requests from S3 through Step Functions",
            env=cdk.Environment(account=config.account, region=config.region),
        )
    return stacks
