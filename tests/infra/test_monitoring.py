from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_sqs as sqs
import aws_cdk.aws_stepfunctions as sfn
from aws_cdk import assertions
from sluice.contract import SHARD_FAILED_STEP, STEPS, WEBHOOK, Step

from infra.monitoring import WEBHOOK_REJECTIONS_THRESHOLD, Monitoring
from infra.stack import build_app
from tests.infra.conftest import CONTEXT, Synthesis
from tests.infra.helpers.workflow import _flat


def _function_of(synthesis: Synthesis, env: str, step: Step) -> str:
    """The logical id of the function that runs `step`."""
    (found,) = [
        logical
        for logical, f in synthesis.resources(env, "AWS::Lambda::Function").items()
        if f["Properties"]["Handler"] == step.handler
    ]
    return found


def test_alarms_watch_final_failures_not_what_the_workflow_retries(synthesis: Synthesis, env: str) -> None:
    from sluice.contract import JOBS_REFUSED

    alarms = synthesis.resources(env, "AWS::CloudWatch::Alarm").values()
    metrics = sorted(((a["Properties"].get("Namespace"), a["Properties"].get("MetricName")) for a in alarms), key=str)
    expected = [
        ("AWS/States", "ExecutionsFailed"),
        ("AWS/States", "ExecutionsTimedOut"),
        ("AWS/Lambda", "Invocations"),  # ShardFailed: a shard that failed after its retries
        ("AWS/Lambda", "Errors"),  # the webhook receiver, which Step Functions does not retry
        ("AWS/SQS", "ApproximateNumberOfMessagesVisible"),
        ("Sluice", "WebhookRejected"),
        ("Sluice", "JobsOverErrorRate"),
    ]
    # and one on DynamoDB's throttling, a math expression over its metrics (no namespace of its own)
    assert sorted(m for m in metrics if m != (None, None)) == sorted(expected, key=str)
    assert metrics.count((None, None)) == 1
    (topic_id,) = synthesis.resources(env, "AWS::SNS::Topic")
    for alarm in alarms:
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}]
        assert alarm["Properties"]["AlarmDescription"]

    lambda_alarms = {
        a["Properties"]["MetricName"]: {d["Name"]: d["Value"] for d in a["Properties"]["Dimensions"]}
        for a in alarms
        if a["Properties"].get("Namespace") == "AWS/Lambda"
    }
    assert lambda_alarms == {
        "Invocations": {"FunctionName": {"Ref": _function_of(synthesis, env, STEPS[SHARD_FAILED_STEP])}},
        "Errors": {"FunctionName": {"Ref": _function_of(synthesis, env, WEBHOOK)}},
    }
    # no step the definition retries pages on its Lambda errors or throttles, and a user's bad input pages nobody
    assert not [a for a in alarms if a["Properties"].get("MetricName") in ("Throttles", JOBS_REFUSED)]


def test_alarm_topic_is_encrypted_ssl_only_and_cloudwatch_can_use_its_key(synthesis: Synthesis, env: str) -> None:
    ((_topic_id, topic),) = synthesis.resources(env, "AWS::SNS::Topic").items()
    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    (policy,) = synthesis.resources(env, "AWS::SNS::TopicPolicy").values()
    assert any(
        s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
    )
    key = synthesis.resources(env, "AWS::KMS::Key")[key_id]["Properties"]
    assert key["EnableKeyRotation"] is True
    assert any(s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"} for s in key["KeyPolicy"]["Statement"])
    synthesis.templates[env].resource_count_is("AWS::CloudWatch::Dashboard", 1)


def test_email_subscription_only_when_configured() -> None:
    def subscriptions(email: str | None) -> int:
        stack = cdk.Stack()
        Monitoring(
            stack,
            "Monitoring",
            env_name="test",
            state_machine=sfn.StateMachine.from_state_machine_arn(
                stack, "Machine", "arn:aws:states:us-east-1:123456789012:stateMachine:sluice-test"
            ),
            functions={
                "plan": lambda_.Function.from_function_arn(
                    stack, "Plan", "arn:aws:lambda:us-east-1:123456789012:function:plan"
                )
            },
            dead_letter_queue=sqs.Queue.from_queue_arn(stack, "Dlq", "arn:aws:sqs:us-east-1:123456789012:dlq"),
            alarm_email=email,
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        template = assertions.Template.from_stack(stack)
        found = template.find_resources("AWS::SNS::Subscription")
        for subscription in found.values():
            assert subscription["Properties"]["Protocol"] == "email"
            assert subscription["Properties"]["Endpoint"] == email
        return len(found)

    assert subscriptions("ops@example.com") == 1
    assert subscriptions(None) == 0


def test_no_warning_once_alarm_email_is_set() -> None:
    from tests.infra.helpers.config import with_value

    environments = with_value("prod", "alarm_email", "oncall@sluice-ops.net")
    app = cdk.App(context={**CONTEXT, "environments": environments, "aws:cdk:bundling-stacks": []})
    stack = build_app(app, ["prod"])["prod"]
    found = assertions.Annotations.from_stack(stack).find_warning("*", assertions.Match.string_like_regexp("alarm"))
    assert found == []


def test_prod_as_shipped_alarms_a_placeholder_address_and_says_to_change_it(synthesis: Synthesis) -> None:
    from infra.monitoring import PLACEHOLDER_EMAIL_WARNING

    assert synthesis.stacks["prod"].config.alarm_email == "ops@example.com"
    (subscription,) = synthesis.resources("prod", "AWS::SNS::Subscription").values()
    assert subscription["Properties"]["Endpoint"] == "ops@example.com"
    warnings = assertions.Annotations.from_stack(synthesis.stacks["prod"]).find_warning(
        "*", assertions.Match.string_like_regexp("alarm")
    )
    assert [w.entry.data for w in warnings] == [
        "The alarms of Sluice prod go to ops@example.com, a placeholder that reaches nobody. Set `alarm_email` of "
        "environment 'prod' in cdk.json (context.environments.prod.alarm_email) to the address that answers them. "
        f"[ack: {PLACEHOLDER_EMAIL_WARNING}]"
    ]


def test_alarms_publish_to_the_operators_own_topic_too_when_cdk_json_names_one() -> None:
    from tests.infra.helpers.config import with_value

    topic_arn = "arn:aws:sns:eu-west-1:123456789012:ops-pager"
    environments = with_value("prod", "alarm_email", None)
    environments["prod"]["alarm_topic_arn"] = topic_arn
    app = cdk.App(context={**CONTEXT, "environments": environments, "aws:cdk:bundling-stacks": []})
    stack = build_app(app, ["prod"])["prod"]
    template = assertions.Template.from_stack(stack)
    (topic_id,) = template.find_resources("AWS::SNS::Topic")
    alarms = template.find_resources("AWS::CloudWatch::Alarm").values()
    assert alarms and all(a["Properties"]["AlarmActions"] == [{"Ref": topic_id}, topic_arn] for a in alarms)
    assert template.find_resources("AWS::SNS::Subscription") == {}
    found = assertions.Annotations.from_stack(stack).find_warning("*", assertions.Match.string_like_regexp("alarm"))
    assert found == []


def test_rejected_webhooks_alarm_on_this_environments_emf_metric(synthesis: Synthesis, env: str) -> None:
    from sluice_handlers.observability import SERVICE, metrics

    (alarm,) = [
        a["Properties"]
        for a in synthesis.resources(env, "AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == "WebhookRejected"
    ]
    assert alarm["Namespace"] == metrics.namespace
    # the dimension set the handler emits every rejection with; the reason is a finer, second set
    assert sorted(alarm["Dimensions"], key=lambda d: d["Name"]) == [
        {"Name": "environment", "Value": env},
        {"Name": "service", "Value": SERVICE},
    ]
    assert alarm["Statistic"] == "Sum"
    assert alarm["Threshold"] == WEBHOOK_REJECTIONS_THRESHOLD
    assert alarm["TreatMissingData"] == "notBreaching"


def test_a_job_past_its_error_rate_raises_an_alarm_on_the_metric_notify_and_mark_failed_emit(
    synthesis: Synthesis, env: str
) -> None:
    from sluice.contract import JOBS_OVER_ERROR_RATE
    from sluice_handlers.observability import SERVICE, metrics

    (alarm,) = [
        a["Properties"]
        for a in synthesis.resources(env, "AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == JOBS_OVER_ERROR_RATE
    ]
    assert alarm["Namespace"] == metrics.namespace
    assert sorted(alarm["Dimensions"], key=lambda d: d["Name"]) == [
        {"Name": "environment", "Value": env},
        {"Name": "service", "Value": SERVICE},
    ]
    # one such job is worth a look: the metric counts jobs, not lines
    assert (alarm["Statistic"], alarm["Threshold"], alarm["ComparisonOperator"]) == (
        "Sum",
        1,
        "GreaterThanOrEqualToThreshold",
    )
    assert alarm["TreatMissingData"] == "notBreaching"
    (topic_id,) = synthesis.resources(env, "AWS::SNS::Topic")
    assert alarm["AlarmActions"] == [{"Ref": topic_id}]
    assert "max_error_rate" in alarm["AlarmDescription"]


def test_dashboard_shows_jobs_items_shard_latency_and_webhooks(synthesis: Synthesis, env: str) -> None:
    (dashboard,) = synthesis.resources(env, "AWS::CloudWatch::Dashboard").values()
    parts = dashboard["Properties"]["DashboardBody"]["Fn::Join"][1]
    body = "".join(part if isinstance(part, str) else "<ref>" for part in parts)
    titles = ("Jobs", "Items per minute", "Shard latency", "Lambda errors", "Webhooks by verdict", "Webhook endpoint")
    for title in titles:
        assert f'"title":"{title}' in body, title
    metrics = ("JobsCompleted", "JobsFailed", "JobsOverErrorRate", "JobsRefused", "ItemsCompleted", "ItemsFailed")
    for metric in (*metrics, "WebhookRejected"):
        assert f'"{metric}"' in body or f'MetricName=\\"{metric}' in body, metric


def _alarm_conditions(statement: dict[str, Any]) -> tuple[Any, str]:
    condition = statement["Condition"]
    return condition["StringEquals"]["aws:SourceAccount"], _flat(condition["ArnLike"]["aws:SourceArn"])


def test_cloudwatch_may_publish_alarms_to_the_topic_and_use_its_key_for_this_accounts_alarms_only(
    synthesis: Synthesis, env: str
) -> None:
    ((topic_id, topic),) = synthesis.resources(env, "AWS::SNS::Topic").items()
    (policy,) = synthesis.resources(env, "AWS::SNS::TopicPolicy").values()
    assert policy["Properties"]["Topics"] == [{"Ref": topic_id}]
    alarms = "arn:<AWS::Partition>:cloudwatch:<AWS::Region>:<AWS::AccountId>:alarm:*"

    (publish,) = [
        s
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
        if s["Effect"] == "Allow" and s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}
    ]
    assert publish["Action"] == "sns:Publish"
    assert publish["Resource"] == {"Ref": topic_id}
    assert _alarm_conditions(publish) == ({"Ref": "AWS::AccountId"}, alarms)

    key_id = topic["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    key_policy = synthesis.resources(env, "AWS::KMS::Key")[key_id]["Properties"]["KeyPolicy"]
    (use_key,) = [s for s in key_policy["Statement"] if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert sorted(use_key["Action"]) == ["kms:Decrypt", "kms:GenerateDataKey*"]
    assert _alarm_conditions(use_key) == ({"Ref": "AWS::AccountId"}, alarms)


def test_dynamodb_throttling_of_the_table_and_its_index_raises_an_alarm(synthesis: Synthesis, env: str) -> None:
    (table_id,) = synthesis.resources(env, "AWS::DynamoDB::Table")
    (alarm,) = [
        a["Properties"]
        for a in synthesis.resources(env, "AWS::CloudWatch::Alarm").values()
        if "Metrics" in a["Properties"]
    ]
    (expression,) = [m for m in alarm["Metrics"] if "Expression" in m]
    watched = set()
    for metric in alarm["Metrics"]:
        if "MetricStat" not in metric:
            continue
        stat = metric["MetricStat"]["Metric"]
        assert stat["Namespace"] == "AWS/DynamoDB" and metric["Id"] in expression["Expression"]
        dimensions = {d["Name"]: d["Value"] for d in stat["Dimensions"]}
        assert dimensions.pop("TableName") == {"Ref": table_id}
        watched.add((dimensions.get("GlobalSecondaryIndexName", "table"), stat["MetricName"]))
    assert watched == {
        (where, metric)
        for where in ("table", "by_provider_id")
        for metric in ("ReadThrottleEvents", "WriteThrottleEvents")
    }
    # a missing series (no throttling of the index, say) counts as none, not as no data
    assert expression["Expression"].count("FILL(") == 4
    assert alarm["Threshold"] == 1 and alarm["TreatMissingData"] == "notBreaching"
    (topic_id,) = synthesis.resources(env, "AWS::SNS::Topic")
    assert alarm["AlarmActions"] == [{"Ref": topic_id}]


def test_an_environment_whose_alarms_reach_nobody_says_which_setting_to_fill(synthesis: Synthesis) -> None:
    from infra.monitoring import NO_SUBSCRIBER_WARNING

    env = "dev"  # prod refuses to synth so (tests/infra/test_config.py)
    config = synthesis.stacks[env].config
    assert config.alarm_email is None  # as cdk.json ships
    warnings = assertions.Annotations.from_stack(synthesis.stacks[env]).find_warning(
        "*", assertions.Match.string_like_regexp("alarm_email")
    )
    assert [w.entry.data for w in warnings] == [
        f"The alarms of Sluice {env} reach nobody: their topic has no subscriber. Set `alarm_email` of environment "
        f"'{env}' in cdk.json (context.environments.{env}.alarm_email), or subscribe to the AlarmTopic yourself. "
        f"[ack: {NO_SUBSCRIBER_WARNING}]"
    ]
