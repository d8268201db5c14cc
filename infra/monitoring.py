"""Alarms and a dashboard for one Sluice environment."""

from __future__ import annotations

from collections.abc import Mapping

import aws_cdk as cdk
import aws_cdk.aws_cloudwatch as cloudwatch
import aws_cdk.aws_cloudwatch_actions as cloudwatch_actions
import aws_cdk.aws_kms as kms
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_sns as sns
import aws_cdk.aws_sns_subscriptions as subscriptions
import aws_cdk.aws_sqs as sqs
import aws_cdk.aws_stepfunctions as sfn
from constructs import Construct

PERIOD = cdk.Duration.minutes(5)


class Monitoring(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        env_name: str,
        state_machine: sfn.IStateMachine,
        functions: Mapping[str, lambda_.IFunction],
        dead_letter_queue: sqs.IQueue,
        alarm_email: str | None,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        # A customer managed key, because CloudWatch cannot publish to a topic encrypted with
        # the AWS managed SNS key; the stack grants CloudWatch its use.
        self.topic_key = kms.Key(
            self,
            "AlarmTopicKey",
            description=f"Sluice {env_name} alarm topic",
            enable_key_rotation=True,
            removal_policy=removal_policy,
        )
        self.topic = sns.Topic(
            self,
            "AlarmTopic",
            display_name=f"Sluice {env_name} alarms",
            master_key=self.topic_key,
            enforce_ssl=True,
        )
        if alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(alarm_email))

        self.alarms: list[cloudwatch.Alarm] = []
        self._alarm(
            "ExecutionsFailed",
            state_machine.metric_failed(period=PERIOD, statistic="Sum"),
            f"A Sluice {env_name} job failed; its errors file in outbox/ says why.",
        )
        for step, function in functions.items():
            self._alarm(
                f"{_title(step)}Errors",
                function.metric_errors(period=PERIOD, statistic="Sum"),
                f"The {step} Lambda raised errors; the workflow retries transient ones.",
            )
            self._alarm(
                f"{_title(step)}Throttles",
                function.metric_throttles(period=PERIOD, statistic="Sum"),
                f"The {step} Lambda was throttled; check the account's concurrency quota.",
            )
        self._alarm(
            "StartFailures",
            dead_letter_queue.metric_approximate_number_of_messages_visible(period=PERIOD, statistic="Maximum"),
            f"EventBridge could not start Sluice {env_name} jobs; the events wait in the DLQ.",
        )

        # Dashboards are global to the account; the region keeps two deployments apart.
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"Sluice-{env_name}-{cdk.Aws.REGION}")
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Executions",
                left=[
                    state_machine.metric_started(period=PERIOD, statistic="Sum"),
                    state_machine.metric_succeeded(period=PERIOD, statistic="Sum"),
                    state_machine.metric_failed(period=PERIOD, statistic="Sum"),
                    state_machine.metric_timed_out(period=PERIOD, statistic="Sum"),
                ],
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Execution time (p50, p99)",
                left=[
                    state_machine.metric_time(period=PERIOD, statistic="p50"),
                    state_machine.metric_time(period=PERIOD, statistic="p99"),
                ],
                width=12,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Lambda errors",
                left=[f.metric_errors(period=PERIOD, statistic="Sum", label=s) for s, f in functions.items()],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Lambda duration (p99)",
                left=[f.metric_duration(period=PERIOD, statistic="p99", label=s) for s, f in functions.items()],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Lambda throttles and DLQ",
                left=[f.metric_throttles(period=PERIOD, statistic="Sum", label=s) for s, f in functions.items()],
                right=[dead_letter_queue.metric_approximate_number_of_messages_visible(period=PERIOD)],
                width=8,
            ),
        )

    def _alarm(self, name: str, metric: cloudwatch.Metric, description: str) -> None:
        alarm = metric.create_alarm(
            self,
            name,
            alarm_description=description,
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        alarm.add_alarm_action(cloudwatch_actions.SnsAction(self.topic))
        self.alarms.append(alarm)


def _title(step: str) -> str:
    return "".join(part.title() for part in step.split("_"))
