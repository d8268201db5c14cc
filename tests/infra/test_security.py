"""Least privilege, cdk-nag's AwsSolutions pack, and cfn-lint, on both environments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cfnlint.api import ManualArgs, lint

from tests.infra.conftest import BEDROCK_ENV, Synthesis
from tests.infra.helpers.functions import secret_id, step_functions, webhook_function
from tests.infra.helpers.security import _listed, _role_statements, _statements
from tests.infra.helpers.workflow import _flat

PROVIDER_STEPS = ("run_shard", "submit", "collect", "submit_batch", "collect_batch")
# the steps that read the API key: the senders, and those that cancel a failed shard's or job's open work
KEY_READERS = (*PROVIDER_STEPS, "fail_shard", "mark_failed")
# whoever reads the input reads it by the version Plan cut, in a versioned bucket
INPUT_S3 = {("s3:GetObject", "inbox/*"), ("s3:GetObjectVersion", "inbox/*")}
PROVIDER_S3 = INPUT_S3 | {
    ("s3:GetObject", "jobs/*"),
    ("s3:PutObject", "jobs/*"),
    ("s3:ListBucket", ""),
    # the answers they get, into the response cache: a segment and its index, nothing else of cache/
    ("s3:PutObject", "cache/segments/*"),
    ("s3:PutObject", "cache/index/*"),
}
# in a Bedrock environment the batch steps also run Bedrock batch inference jobs: they put a job's
# input, read its input and output back, and delete both
BEDROCK = ["bedrock-batch/input/*", "bedrock-batch/output/*"]
BATCH_S3 = (
    PROVIDER_S3
    | {("s3:PutObject", BEDROCK[0])}
    | {(a, p) for a in ("s3:GetObject", "s3:DeleteObject") for p in BEDROCK}
)
OUTPUT_S3 = {
    ("s3:GetObject", "jobs/*"),
    ("s3:PutObject", "outbox/*"),
    ("s3:AbortMultipartUpload", "outbox/*"),
    ("s3:ListBucket", ""),
}
JOBS, CACHE, TURNAROUNDS = ["jobs/", "jobs/*"], ["cache/", "cache/*"], ["turnarounds/", "turnarounds/*"]
EXPECTED_S3 = {
    "plan": INPUT_S3
    | {
        ("s3:PutObject", "jobs/*"),
        # the response cache: it lists and reads the indexes, and reads the hits; nothing it writes
        ("s3:GetObject", "cache/*"),
        ("s3:ListBucket", ""),
        # a deadline job's plan reads the batch turnarounds earlier jobs measured
        ("s3:GetObject", "turnarounds/*"),
        # its one write to outbox/: a refused job's summary, and no other output of any job
        ("s3:PutObject", "outbox/*.refused-*.summary.json"),
    },
    "run_shard": PROVIDER_S3,
    "submit": PROVIDER_S3,
    "collect": PROVIDER_S3,
    "submit_batch": BATCH_S3,
    "collect_batch": BATCH_S3,
    "await_shard": set(),
    # a shard's slot among the shards in flight: the jobs table only
    "take_slot": set(),
    "give_back_slot": set(),
    # Merge copies the shards' files; only MarkFailed reads the input, for the lines never finished.
    # Merge also compacts the response cache's indexes (it lists the segments, reads none)
    "merge": OUTPUT_S3
    | {
        ("s3:GetObject", "cache/index/*"),
        ("s3:PutObject", "cache/index/*"),
        ("s3:DeleteObject", "cache/index/*"),
        # and adds the job's measured batch turnarounds to their model's object
        ("s3:GetObject", "turnarounds/*"),
        ("s3:PutObject", "turnarounds/*"),
    },
    # it finishes the shards a failed job left unfinished before it writes the outputs
    "mark_failed": OUTPUT_S3
    | INPUT_S3
    | {
        ("s3:PutObject", "jobs/*/shards/*/results.jsonl"),
        ("s3:PutObject", "jobs/*/shards/*/errors.jsonl"),
        ("s3:PutObject", "jobs/*/shards/*/stats.json"),
    },
    "notify": set(),
    # a failed shard's lines and parts read, its outputs written; nothing of outbox/ or the cache
    "fail_shard": INPUT_S3
    | {
        ("s3:GetObject", "jobs/*"),
        ("s3:ListBucket", ""),
        ("s3:PutObject", "jobs/*/shards/*/results.jsonl"),
        ("s3:PutObject", "jobs/*/shards/*/errors.jsonl"),
        ("s3:PutObject", "jobs/*/shards/*/stats.json"),
    },
}


def _iam_documents(raw: dict[str, Any]) -> list[dict[str, Any]]:
    documents = []
    for resource in raw["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            documents.append(props["PolicyDocument"])
        if resource["Type"] == "AWS::IAM::Role":
            documents.extend(p["PolicyDocument"] for p in props.get("Policies", []))
    return documents


def _step_statements(synthesis: Synthesis, env: str) -> dict[str, list[dict[str, Any]]]:
    return {
        step: _role_statements(synthesis, env, function) for step, function in step_functions(synthesis, env).items()
    }


def test_no_wildcard_actions_in_any_iam_policy(synthesis: Synthesis, env: str) -> None:
    documents = _iam_documents(synthesis.raw[env])
    assert documents
    for document in documents:
        for statement in _statements(document):
            for action in _listed(statement["Action"]):
                assert "*" not in action, f"wildcard action {action!r} in {json.dumps(statement)}"


def test_each_step_gets_exactly_its_s3_access(synthesis: Synthesis, env: str, bedrock_synthesis: Synthesis) -> None:
    _exact_s3_access(synthesis, env)
    _exact_s3_access(bedrock_synthesis, BEDROCK_ENV)


def _exact_s3_access(synthesis: Synthesis, env: str) -> None:
    on_bedrock = synthesis.stacks[env].config.provider == "bedrock"
    for step, statements in _step_statements(synthesis, env).items():
        granted = set()
        for statement in statements:
            for action in _listed(statement["Action"]):
                if not action.startswith("s3:"):
                    continue
                for resource in _listed(statement["Resource"]):
                    arn = _flat(resource)
                    suffix = arn.split(".Arn>", 1)[1].lstrip("/")
                    granted.add((action, suffix))
                    if action == "s3:ListBucket":
                        listed = {"plan": [CACHE, TURNAROUNDS], "merge": [JOBS, CACHE, TURNAROUNDS]}.get(step, [JOBS])
                        listed += [BEDROCK] if on_bedrock and step in ("submit_batch", "collect_batch") else []
                        assert statement["Condition"] in [{"StringLike": {"s3:prefix": p}} for p in listed]
        expected = EXPECTED_S3[step] if on_bedrock or EXPECTED_S3[step] is not BATCH_S3 else PROVIDER_S3
        assert granted == expected, (env, step)


def test_only_provider_steps_read_the_api_key(synthesis: Synthesis, env: str) -> None:
    for step, statements in _step_statements(synthesis, env).items():
        actions = {a for s in statements for a in _listed(s["Action"])}
        assert ("secretsmanager:GetSecretValue" in actions) is (step in KEY_READERS), step
        assert not any(a.startswith("secretsmanager:") and a != "secretsmanager:GetSecretValue" for a in actions)
        # Merge's outcome goes out through Notify; MarkFailed announces a failure itself
        assert ("events:PutEvents" in actions) is (step in ("mark_failed", "notify")), step
        assert ("states:SendTaskSuccess" in actions) is (step == "await_shard"), step


def test_webhook_role_has_exactly_what_the_handler_needs(synthesis: Synthesis, env: str) -> None:
    function = webhook_function(synthesis, env)
    granted = {
        (action, _flat(resource))
        for statement in _role_statements(synthesis, env, function)
        for action in _listed(statement["Action"])
        for resource in _listed(statement["Resource"])
    }
    assert all(s["Effect"] == "Allow" and "Condition" not in s for s in _role_statements(synthesis, env, function))
    (table_id,) = synthesis.resources(env, "AWS::DynamoDB::Table")
    log_group = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
    assert granted == {
        ("logs:CreateLogStream", f"<{log_group}.Arn>"),
        ("logs:PutLogEvents", f"<{log_group}.Arn>"),
        ("dynamodb:GetItem", f"<{table_id}.Arn>"),
        ("dynamodb:PutItem", f"<{table_id}.Arn>"),
        ("dynamodb:UpdateItem", f"<{table_id}.Arn>"),
        ("dynamodb:Query", f"<{table_id}.Arn>/index/by_provider_id"),
        ("secretsmanager:GetSecretValue", f"<{secret_id(synthesis, env, 'webhook-signing-secret')}>"),
        # task tokens: no resource type in the Service Authorization Reference, so "*"
        ("states:SendTaskSuccess", "*"),
        # active tracing; X-Ray's actions have no resource-level permissions
        ("xray:PutTelemetryRecords", "*"),
        ("xray:PutTraceSegments", "*"),
    }
    # in particular: not the provider API key, and nothing in S3
    assert not any(resource == f"<{secret_id(synthesis, env, 'provider-api-key')}>" for _, resource in granted)
    assert not any(action.startswith("s3:") for action, _ in granted)


def test_only_api_gateway_and_bedrocks_job_rule_invoke_the_webhook_function(
    synthesis: Synthesis, env: str, bedrock_synthesis: Synthesis
) -> None:
    # Bedrock's rule only in a Bedrock environment
    (permission,) = _webhook_invokers(synthesis, env)
    assert permission["Principal"] == "apigateway.amazonaws.com"
    (permission, rule) = _webhook_invokers(bedrock_synthesis, BEDROCK_ENV)
    assert permission["Principal"] == "apigateway.amazonaws.com"
    assert _flat(permission["SourceArn"]).endswith("/*/*/webhooks")
    # EventBridge, for the rule that hears Bedrock batch inference jobs end, and for it only
    assert rule["Principal"] == "events.amazonaws.com"
    rules = bedrock_synthesis.resources(BEDROCK_ENV, "AWS::Events::Rule")
    (logical,) = [k for k, r in rules.items() if r["Properties"]["EventPattern"].get("source") == ["aws.bedrock"]]
    assert rule["SourceArn"] == {"Fn::GetAtt": [logical, "Arn"]}


def _webhook_invokers(synthesis: Synthesis, env: str) -> list[dict[str, Any]]:
    webhook_id = next(
        k
        for k, f in synthesis.resources(env, "AWS::Lambda::Function").items()
        if f["Properties"].get("Handler") == "sluice_handlers.webhook.handler"
    )
    permissions = [
        p["Properties"]
        for p in synthesis.resources(env, "AWS::Lambda::Permission").values()
        if p["Properties"]["FunctionName"] == {"Fn::GetAtt": [webhook_id, "Arn"]}
    ]
    return sorted(permissions, key=lambda p: str(p["Principal"]))


def test_notify_cannot_touch_s3(synthesis: Synthesis, env: str) -> None:
    notify = _step_statements(synthesis, env)["notify"]
    assert not [a for s in notify for a in _listed(s["Action"]) if a.startswith("s3:")]


def test_cdk_nag_aws_solutions_has_no_unacknowledged_findings(synthesis: Synthesis) -> None:
    findings = [
        f"{violation['ruleName']} ({violation['severity']}) at {construct['constructPath']}"
        for report in synthesis.validation_report.get("pluginReports", [])
        if report["pluginName"] == "AwsSolutions"
        for violation in report.get("violations", [])
        for construct in violation["violatingConstructs"]
    ]
    assert not findings, "\n".join(findings)
    assert synthesis.validation_error is None, synthesis.validation_error


def test_cfn_lint_is_clean(synthesis: Synthesis, env: str) -> None:
    # W3005: CDK makes a resource depend on its role's policy as well as the role, and the
    # role dependency is then also implied by a GetAtt; harmless and not ours to change.
    config = ManualArgs(regions=["us-east-1", "eu-west-1"], ignore_checks=["W3005"])
    matches = lint(json.dumps(synthesis.raw[env]), config=config)
    assert not matches, "\n".join(str(m) for m in matches)


def _granted(statements: list[dict[str, Any]], prefix: str) -> set[tuple[str, str]]:
    return {
        (action, _flat(resource))
        for statement in statements
        for action in _listed(statement["Action"])
        if action.startswith(prefix)
        for resource in _listed(statement["Resource"])
    }


def test_each_function_gets_exactly_its_dynamodb_actions(synthesis: Synthesis, env: str) -> None:
    from infra.table_access import INDEX_ACTIONS, TABLE_ACTIONS

    (table_id,) = synthesis.resources(env, "AWS::DynamoDB::Table")
    table = f"<{table_id}.Arn>"
    functions = {**step_functions(synthesis, env), "webhook": webhook_function(synthesis, env)}
    assert set(functions) == set(TABLE_ACTIONS)
    for name, function in functions.items():
        granted = _granted(_role_statements(synthesis, env, function), "dynamodb:")
        expected = {(action, table) for action in TABLE_ACTIONS[name]}
        expected |= {(action, f"{table}/index/by_provider_id") for action in INDEX_ACTIONS.get(name, ())}
        assert granted == expected, name
        # no step scans, deletes, or reads an index it does not query
        assert not {a for a, _ in granted} & {"dynamodb:Scan", "dynamodb:DeleteItem", "dynamodb:DescribeTable"}
        assert not any(resource.endswith("/index/*") for _, resource in granted), name
    # the steps that read job progress or shard rows may read several rows at once
    for name in ("run_shard", "submit", "collect", "submit_batch", "collect_batch", "merge", "mark_failed"):
        assert "dynamodb:BatchGetItem" in TABLE_ACTIONS[name], name
    assert TABLE_ACTIONS["notify"] == ()


def test_task_tokens_are_returned_under_the_documented_grant(synthesis: Synthesis, env: str) -> None:
    """SendTask* have no resource type in the Service Authorization Reference: "Resource": "*"."""
    functions = {**step_functions(synthesis, env), "webhook": webhook_function(synthesis, env)}
    callers = {}
    for name, function in functions.items():
        granted = _granted(_role_statements(synthesis, env, function), "states:SendTask")
        if granted:
            callers[name] = granted
    # each only wakes a task; neither fails one nor beats a heart
    assert callers == {
        "await_shard": {("states:SendTaskSuccess", "*")},
        "webhook": {("states:SendTaskSuccess", "*")},
    }


@pytest.mark.slow
def test_a_new_statement_on_every_resource_is_a_finding(tmp_path: Path) -> None:
    """Acknowledgements name their actions: one more action on "*" on an acknowledged role is flagged."""
    import aws_cdk as cdk
    import aws_cdk.aws_iam as iam

    from infra.checks import SecurityChecks
    from infra.config import cdk_json_context
    from infra.stack import build_app

    app = cdk.App(context={**cdk_json_context(), "aws:cdk:bundling-stacks": []}, outdir=str(tmp_path))
    stack = build_app(app, ["dev"])["dev"]
    role = stack.functions.by_step["merge"].role
    assert role is not None
    role.add_to_principal_policy(iam.PolicyStatement(actions=["cloudwatch:PutMetricData"], resources=["*"]))
    cdk.Validations.of(app).add_plugins(SecurityChecks(app))
    with pytest.raises(Exception, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    findings = {
        (violation["ruleName"], construct["constructPath"])
        for plugin in report["pluginReports"]
        if plugin["pluginName"] == "AwsSolutions"
        for violation in plugin["violations"]
        for construct in violation["violatingConstructs"]
    }
    assert findings == {
        ("AwsSolutions-IAM5[Action::cloudwatch:PutMetricData]", "Sluice-dev/Functions/MergeRole/DefaultPolicy/Resource")
    }


def test_the_slot_steps_reach_only_the_jobs_table(synthesis: Synthesis, env: str) -> None:
    from infra.table_access import TABLE_ACTIONS

    for step, statements in _step_statements(synthesis, env).items():
        if step not in ("take_slot", "give_back_slot"):
            continue
        actions = {action for statement in statements for action in _listed(statement["Action"])}
        assert {a for a in actions if not a.startswith(("logs:", "xray:"))} == set(TABLE_ACTIONS[step]), step
    assert TABLE_ACTIONS["give_back_slot"] == ("dynamodb:UpdateItem",)
