"""The job workflow: state machine, its role and logs, and the rule that starts it."""

from __future__ import annotations

from collections.abc import Mapping

import aws_cdk as cdk
import aws_cdk.aws_events as events
import aws_cdk.aws_events_targets as targets
import aws_cdk.aws_iam as iam
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_logs as logs
import aws_cdk.aws_s3 as s3
import aws_cdk.aws_sqs as sqs
import aws_cdk.aws_stepfunctions as sfn
from constructs import Construct
from sluice.contract import INBOX_PREFIX
from sluice.contract.definition import FUNCTION_PLACEHOLDERS, definition_json

from infra.config import stack_instance_id

INBOX_PATTERN = f"{INBOX_PREFIX}*.jsonl"


class Workflow(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        env_name: str,
        bucket: s3.IBucket,
        functions: Mapping[str, lambda_.IFunction],
        log_retention: logs.RetentionDays,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        missing = sorted(set(FUNCTION_PLACEHOLDERS) - set(functions))
        if missing:
            raise ValueError(f"no function for step(s) {', '.join(missing)} of the definition")

        # Explicit so the role's policy can name the state machine (and its Map runs' child
        # executions) by ARN without referring to the resource it is attached to; unique to this
        # stack, since a retained state machine outlives it. Users find it in the stack's outputs.
        instance = stack_instance_id(self)
        self.state_machine_name = f"sluice-{env_name}-{instance}"
        stack = cdk.Stack.of(self)
        self.state_machine_arn = stack.format_arn(
            service="states",
            resource="stateMachine",
            resource_name=self.state_machine_name,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        self.execution_arns = [
            stack.format_arn(
                service="states",
                resource="execution",
                resource_name=f"{self.state_machine_name}{separator}*",
                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
            )
            for separator in ("/", ":")
        ]

        # The /aws/vendedlogs/ prefix keeps CloudWatch Logs' resource policy from growing with
        # every log group Step Functions delivers to.
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            log_group_name=f"/aws/vendedlogs/states/sluice-{env_name}-{instance}",
            retention=log_retention,
            removal_policy=removal_policy,
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
            description=f"Sluice {env_name} workflow",
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=self.state_machine_name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_string(definition_json()),
            definition_substitutions={
                placeholder: functions[step].function_arn for step, placeholder in FUNCTION_PLACEHOLDERS.items()
            },
            role=self.role,
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ERROR, include_execution_data=False),
            tracing_enabled=True,
            removal_policy=removal_policy,
        )

        self.dead_letter_queue, self.rule = self._start_rule(env_name, bucket, removal_policy)

    def _start_rule(
        self, env_name: str, bucket: s3.IBucket, removal_policy: cdk.RemovalPolicy
    ) -> tuple[sqs.Queue, events.Rule]:
        """The rule that starts a job for each JSONL object put in inbox/, and the queue of the starts that failed."""
        dead_letter_queue = sqs.Queue(
            self,
            "DeadLetterQueue",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=cdk.Duration.days(14),
            removal_policy=removal_policy,
        )
        # S3 does not filter EventBridge events by key; the rule does. One field cannot AND a
        # prefix with a suffix, a wildcard can.
        rule = events.Rule(
            self,
            "ObjectCreated",
            description=f"Start a Sluice {env_name} job for each JSONL object in inbox/",
            event_pattern=events.EventPattern(
                source=["aws.s3"],
                detail_type=["Object Created"],
                detail={
                    "bucket": {"name": [bucket.bucket_name]},
                    "object": {"key": events.Match.wildcard(INBOX_PATTERN)},
                },
            ),
        )
        # A start that fails (throttling, a quota) is retried for a day, then kept in the DLQ
        # so that no uploaded file is silently ignored.
        rule.add_target(
            targets.SfnStateMachine(
                self.state_machine,
                dead_letter_queue=dead_letter_queue,
                retry_attempts=185,
                max_event_age=cdk.Duration.hours(24),
            )
        )
        return dead_letter_queue, rule
