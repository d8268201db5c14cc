"""Alarms and a dashboard for one Sluice environment.

Besides AWS's own metrics, the handlers emit EMF metrics (`sluice_handlers/observability.py`) in the
`Sluice` namespace with the dimensions environment and service (and reason, for rejected
webhooks): jobs and items as they finish, and webhooks by verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import aws_cdk as cdk
import aws_cdk.aws_apigatewayv2 as apigwv2
import aws_cdk.aws_cloudwatch as cloudwatch
import aws_cdk.aws_cloudwatch_actions as cloudwatch_actions
import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_kms as kms
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_sns as sns
import aws_cdk.aws_sns_subscriptions as subscriptions
import aws_cdk.aws_sqs as sqs
import aws_cdk.aws_stepfunctions as sfn
from constructs import Construct
from sluice.contract import (
    JOBS_OVER_ERROR_RATE,
    JOBS_REFUSED,
    METRICS_NAMESPACE,
    PROVIDER_STEPS,
    SERVICE,
    SHARD_FAILED_STEP,
    WEBHOOK,
)

PERIOD = cdk.Duration.minutes(5)
MINUTE = cdk.Duration.minutes(1)
# Providers retry a delivery that was refused, so a wrong signing secret keeps rejections coming
# for as long as jobs run; a stray probe of the URL is one or two. The window tells them apart.
WEBHOOK_REJECTIONS_PERIOD = cdk.Duration.minutes(15)
WEBHOOK_REJECTIONS_THRESHOLD = 5
# DynamoDB's throttle counts, for the table and for each index: one of these above zero is a hot
# key or partition (the SDK retries it, so it costs time first, then fails a step as `Transient`).
THROTTLE_METRICS = ("ReadThrottleEvents", "WriteThrottleEvents")
# The id of the warning an environment gets when its alarms reach nobody.
NO_SUBSCRIBER_WARNING = "sluice:alarms-reach-nobody"
# ... and when they go to an address at a domain reserved for examples (RFC 2606), as cdk.json's prod ships
PLACEHOLDER_EMAIL_WARNING = "sluice:alarm-email-placeholder"
EXAMPLE_DOMAINS = frozenset({"example.com", "example.org", "example.net"})


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
        alarm_topic_arn: str | None = None,
        webhook_api: apigwv2.IHttpApi | None = None,
        table: dynamodb.ITable | None = None,
        table_indexes: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, id)
        self.env_name = env_name
        self.topic_key, self.topic = self._alarm_topic(env_name, alarm_email, removal_policy)
        self.alarm_topics: list[sns.ITopic] = [self.topic]
        if alarm_topic_arn:
            self.alarm_topics.append(sns.Topic.from_topic_arn(self, "OperatorTopic", alarm_topic_arn))
        self._warn_if_unheard(env_name, alarm_email, alarm_topic_arn)
        self.alarms: list[cloudwatch.Alarm] = []
        self._add_alarms(env_name, state_machine, functions, dead_letter_queue, table, table_indexes)
        # Dashboards are global to the account; the region keeps two deployments apart.
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"Sluice-{env_name}-{cdk.Aws.REGION}")
        self._aws_widgets(state_machine, functions, dead_letter_queue)
        self._sluice_widgets(env_name, functions, webhook_api)
        if table is not None:
            self.dashboard.add_widgets(
                cloudwatch.GraphWidget(
                    title="DynamoDB throttle events", left=list(self.throttle_metrics.values()), width=24
                )
            )

    def _alarm_topic(
        self, env_name: str, alarm_email: str | None, removal_policy: cdk.RemovalPolicy
    ) -> tuple[kms.Key, sns.Topic]:
        """The topic every alarm publishes to, its key, and its subscriber (a warning when none)."""
        # A customer managed key, because CloudWatch cannot publish to a topic encrypted with
        # the AWS managed SNS key; the stack grants CloudWatch its use.
        key = kms.Key(
            self,
            "AlarmTopicKey",
            description=f"Sluice {env_name} alarm topic",
            enable_key_rotation=True,
            removal_policy=removal_policy,
        )
        topic = sns.Topic(
            self,
            "AlarmTopic",
            display_name=f"Sluice {env_name} alarms",
            master_key=key,
            enforce_ssl=True,
        )
        if alarm_email:
            topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
        return key, topic

    def _warn_if_unheard(self, env_name: str, alarm_email: str | None, alarm_topic_arn: str | None) -> None:
        """A warning when the alarms go nowhere, or to an address that is only an example.

        A production environment never gets here without one (`infra.config`); the address is
        checked too, since cdk.json ships prod with a placeholder that deploys and reaches nobody."""
        if not (alarm_email or alarm_topic_arn):
            cdk.Annotations.of(self).add_warning_v2(
                NO_SUBSCRIBER_WARNING,
                f"The alarms of Sluice {env_name} reach nobody: their topic has no subscriber. Set "
                f"`alarm_email` of environment {env_name!r} in cdk.json (context.environments.{env_name}.alarm_email), "
                "or subscribe to the AlarmTopic yourself.",
            )
        elif alarm_email and alarm_email.rsplit("@", 1)[-1].lower() in EXAMPLE_DOMAINS:
            cdk.Annotations.of(self).add_warning_v2(
                PLACEHOLDER_EMAIL_WARNING,
                f"The alarms of Sluice {env_name} go to {alarm_email}, a placeholder that reaches nobody. Set "
                f"`alarm_email` of environment {env_name!r} in cdk.json (context.environments.{env_name}.alarm_email) "
                "to the address that answers them.",
            )

    def _add_alarms(
        self,
        env_name: str,
        state_machine: sfn.IStateMachine,
        functions: Mapping[str, lambda_.IFunction],
        dead_letter_queue: sqs.IQueue,
        table: dynamodb.ITable | None,
        table_indexes: Sequence[str],
    ) -> None:
        """An alarm for each failure an operator acts on: jobs, functions, the table, starts, webhooks.

        None watches a step's Lambda errors or throttles: the definition retries those by design
        (TRANSIENT_RETRY, THROTTLE_RETRY), and a page for each retry that then succeeded is noise.
        The alarms are on what outlasted the retries instead."""
        # A job that could not finish: MarkFailed accounted for its lines, and the execution ended
        # in `Job failed`. A job Plan refused for its user's input ends in `Job refused`, which
        # succeeds: the user hears of it (summary, event), and JobsRefused counts it on the dashboard.
        self._alarm(
            "ExecutionsFailed",
            state_machine.metric_failed(period=PERIOD, statistic="Sum"),
            f"A Sluice {env_name} job failed; its errors file and summary in outbox/ say why.",
        )
        # A job whose every line failed (a revoked key, insufficient_quota) ends with its execution
        # SUCCEEDED: only the job's own figures, counted by Notify and MarkFailed, show it.
        self._alarm(
            "JobsOverErrorRate",
            self.metric(JOBS_OVER_ERROR_RATE),
            f"A Sluice {env_name} job ended with more failed lines than its max_error_rate allows, or with every "
            "line failed. Its errors file in outbox/ names each line's cause; a cause shared by all of them (an "
            "invalid or revoked API key, insufficient_quota) is the provider account's to fix.",
        )
        # An execution that times out ends where it is, without MarkFailed: its job has no outputs
        # and its row stays RUNNING. The machine sets no timeout today, so only a state machine
        # timeout added later, or Step Functions' year, gets here.
        self._alarm(
            "ExecutionsTimedOut",
            state_machine.metric_timed_out(period=PERIOD, statistic="Sum"),
            f"A Sluice {env_name} execution timed out before its job ended; its outputs may be missing. "
            "The execution's history in Step Functions shows the step it was in.",
        )
        # A shard step failed after all its retries: its lines are errors, its siblings ran on.
        shard_failed = functions.get(SHARD_FAILED_STEP)
        if shard_failed is not None:
            self._alarm(
                "ShardsFailed",
                shard_failed.metric_invocations(period=PERIOD, statistic="Sum"),
                f"A shard of a Sluice {env_name} job failed after its retries; its unfinished lines are errors "
                "`shard_failed` naming the cause, and the job's summary says whether it passed max_error_rate.",
            )
        # Step Functions does not call the webhook receiver, so nothing retries its errors but the
        # provider, and a receiver that keeps failing leaves jobs to find their answers by polling.
        webhook = functions.get(WEBHOOK.name)
        if webhook is not None:
            self._alarm(
                "WebhookErrors",
                webhook.metric_errors(period=PERIOD, statistic="Sum"),
                f"The Sluice {env_name} webhook receiver raised errors; the provider retries the delivery, and "
                "jobs fall back to polling, only later. Its logs say why.",
            )
        if table is not None:
            self.table_throttles = self._throttles(table, table_indexes)
            self._alarm(
                "TableThrottles",
                self.table_throttles,
                f"DynamoDB throttled reads or writes of the Sluice {env_name} table or its index: a hot key or "
                "partition. The SDK retries them; what outlasts its retries fails a step, which the workflow "
                "retries. The dashboard shows which.",
            )
        self._alarm(
            "StartFailures",
            dead_letter_queue.metric_approximate_number_of_messages_visible(period=PERIOD, statistic="Maximum"),
            f"EventBridge could not start Sluice {env_name} jobs; the events wait in the DLQ.",
        )
        self._alarm(
            "WebhooksRejected",
            self.metric("WebhookRejected", period=WEBHOOK_REJECTIONS_PERIOD),
            f"Sluice {env_name} rejected provider webhooks. Mostly `signature`: the webhook signing secret does "
            "not match the provider's (set it with put-secret-value); jobs still finish, by polling, only later. "
            "The dashboard shows the reasons.",
            threshold=WEBHOOK_REJECTIONS_THRESHOLD,
        )

    def _aws_widgets(
        self,
        state_machine: sfn.IStateMachine,
        functions: Mapping[str, lambda_.IFunction],
        dead_letter_queue: sqs.IQueue,
    ) -> None:
        """The dashboard's rows of AWS's own metrics: the executions, then the functions."""
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

    def _sluice_widgets(
        self, env_name: str, functions: Mapping[str, lambda_.IFunction], webhook_api: apigwv2.IHttpApi | None
    ) -> None:
        """The dashboard's rows of the handlers' metrics: jobs, items and shard latency, then webhooks."""
        # the steps that work through a shard's lines: their duration is the shard latency
        shard_steps = [step for step in PROVIDER_STEPS if step in functions]
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Jobs",
                left=[
                    self.metric("JobsCompleted"),
                    self.metric("JobsFailed"),
                    self.metric(JOBS_OVER_ERROR_RATE),
                    self.metric(JOBS_REFUSED),
                ],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Items per minute",
                left=[
                    self.metric("ItemsCompleted", period=MINUTE, label="finished by direct shard runs"),
                    self.metric("ItemsSucceeded", period=MINUTE, label="results, as jobs end"),
                    self.metric("ItemsFailed", period=MINUTE, label="errors, as jobs end"),
                ],
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Shard latency (Lambda duration p50, max)",
                left=[
                    functions[step].metric_duration(period=PERIOD, statistic=statistic, label=f"{step} {statistic}")
                    for step in shard_steps
                    for statistic in ("p50", "Maximum")
                ],
                width=8,
            ),
        )
        webhooks = [
            cloudwatch.GraphWidget(
                title="Webhooks by verdict",
                left=[
                    self.metric("WebhookAccepted"),
                    self.metric("WebhookDuplicate"),
                    cloudwatch.MathExpression(
                        expression=_search("WebhookRejected", ("environment", "reason", "service"), env_name),
                        using_metrics={},
                        label="rejected: ${PROP('Dim.reason')}",
                        period=PERIOD,
                    ),
                ],
                width=12 if webhook_api is not None else 24,
            )
        ]
        if webhook_api is not None:
            webhooks.append(
                cloudwatch.GraphWidget(
                    title="Webhook endpoint",
                    left=[
                        webhook_api.metric_count(period=PERIOD, statistic="Sum"),
                        webhook_api.metric_client_error(period=PERIOD, statistic="Sum"),
                        webhook_api.metric_server_error(period=PERIOD, statistic="Sum"),
                    ],
                    right=[webhook_api.metric_latency(period=PERIOD, statistic="p99")],
                    width=12,
                )
            )
        self.dashboard.add_widgets(*webhooks)

    def metric(self, name: str, *, period: cdk.Duration = PERIOD, label: str | None = None) -> cloudwatch.Metric:
        """One of the handlers' EMF metrics (counts), summed, for this environment."""
        return cloudwatch.Metric(
            namespace=METRICS_NAMESPACE,
            metric_name=name,
            dimensions_map={"environment": self.env_name, "service": SERVICE},
            statistic="Sum",
            period=period,
            label=label,
        )

    def _throttles(self, table: dynamodb.ITable, indexes: Sequence[str]) -> cloudwatch.MathExpression:
        """Read and write throttle events of the table and of each index, summed (a missing one is 0)."""
        metrics: dict[str, cloudwatch.IMetric] = {}
        for where, index in [("table", None), *((f"index{n}", name) for n, name in enumerate(indexes))]:
            dimensions = {"TableName": table.table_name}
            if index is not None:
                dimensions["GlobalSecondaryIndexName"] = index
            for kind in THROTTLE_METRICS:
                metrics[f"{where}{kind[:4].lower()}"] = cloudwatch.Metric(
                    namespace="AWS/DynamoDB",
                    metric_name=kind,
                    dimensions_map=dimensions,
                    statistic="Sum",
                    period=PERIOD,
                    label=f"{index or 'table'} {kind}",
                )
        self.throttle_metrics = metrics
        return cloudwatch.MathExpression(
            expression=" + ".join(f"FILL({name}, 0)" for name in metrics),
            using_metrics=metrics,
            label="DynamoDB throttle events",
            period=PERIOD,
        )

    def _alarm(
        self,
        name: str,
        metric: cloudwatch.Metric | cloudwatch.MathExpression,
        description: str,
        *,
        threshold: int = 1,
    ) -> None:
        alarm = metric.create_alarm(
            self,
            name,
            alarm_description=description,
            threshold=threshold,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        for topic in self.alarm_topics:
            alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))
        self.alarms.append(alarm)


def _search(metric: str, dimensions: tuple[str, ...], env_name: str) -> str:
    """A dashboard SEARCH: one line per value of the dimension not pinned (the reason)."""
    schema = ",".join((METRICS_NAMESPACE, *dimensions))
    query = f'{{{schema}}} MetricName="{metric}" environment="{env_name}"'
    return f"SEARCH('{query}', 'Sum', {int(PERIOD.to_seconds())})"


def _title(step: str) -> str:
    return "".join(part.title() for part in step.split("_"))
