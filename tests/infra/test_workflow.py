from __future__ import annotations

import re

from aws_cdk.assertions import Match
from sluice.contract.definition import FUNCTION_PLACEHOLDERS, definition_json

from tests.infra.conftest import Synthesis
from tests.infra.helpers.workflow import STACK_INSTANCE, _flat


def _only(resources: dict) -> tuple[str, dict]:
    (item,) = resources.items()
    return item


def test_state_machine_runs_the_shared_definition(synthesis: Synthesis, env: str) -> None:
    _, machine = _only(synthesis.resources(env, "AWS::StepFunctions::StateMachine"))
    props = machine["Properties"]
    assert props["DefinitionString"] == definition_json()
    assert props["StateMachineType"] == "STANDARD"
    assert _flat(props["StateMachineName"]) == f"sluice-{env}-{STACK_INSTANCE}"
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props["LoggingConfiguration"]["Level"] == "ERROR"
    assert props["LoggingConfiguration"]["IncludeExecutionData"] is False


def test_every_placeholder_is_a_function_arn(synthesis: Synthesis, env: str) -> None:
    _, machine = _only(synthesis.resources(env, "AWS::StepFunctions::StateMachine"))
    substitutions = machine["Properties"]["DefinitionSubstitutions"]
    placeholders = set(re.findall(r"\$\{(\w+)\}", definition_json()))
    assert placeholders == set(FUNCTION_PLACEHOLDERS.values()) == set(substitutions)
    functions = synthesis.resources(env, "AWS::Lambda::Function")
    targets = set()
    for value in substitutions.values():
        logical_id, attribute = value["Fn::GetAtt"]
        assert attribute == "Arn"
        assert functions[logical_id]["Properties"]["Handler"].startswith("sluice_handlers.")
        targets.add(logical_id)
    assert len(targets) == len(FUNCTION_PLACEHOLDERS)


def test_rule_starts_the_state_machine_for_inbox_jsonl_with_a_dlq(synthesis: Synthesis, env: str) -> None:
    template = synthesis.templates[env]
    machine_id, _ = _only(synthesis.resources(env, "AWS::StepFunctions::StateMachine"))
    queue_id, queue = _only(synthesis.resources(env, "AWS::SQS::Queue"))
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "EventPattern": {
                "source": ["aws.s3"],
                "detail-type": ["Object Created"],
                "detail": {
                    "bucket": {"name": [{"Ref": Match.string_like_regexp("^StorageBucket")}]},
                    "object": {"key": [{"wildcard": "inbox/*.jsonl"}]},
                },
            },
            "State": "ENABLED",
            "Targets": [
                Match.object_like(
                    {
                        "Arn": {"Ref": machine_id},
                        "DeadLetterConfig": {"Arn": {"Fn::GetAtt": [queue_id, "Arn"]}},
                        "RetryPolicy": Match.object_like({"MaximumRetryAttempts": Match.any_value()}),
                        "Input": Match.absent(),
                        "InputPath": Match.absent(),
                        "InputTransformer": Match.absent(),
                    }
                )
            ],
        },
    )
    assert queue["Properties"].get("SqsManagedSseEnabled") or queue["Properties"].get("KmsMasterKeyId")


def _workflow_statements(synthesis: Synthesis, env: str) -> list[dict]:
    policies = synthesis.resources(env, "AWS::IAM::Policy")
    (policy,) = [p for k, p in policies.items() if k.startswith("WorkflowRole")]
    return policy["Properties"]["PolicyDocument"]["Statement"]


def _resources(statement: dict) -> list[str]:
    found = statement["Resource"]
    return [_flat(r) for r in (found if isinstance(found, list) else [found])]


def test_workflow_role_invokes_exactly_the_step_functions(synthesis: Synthesis, env: str) -> None:
    functions = synthesis.resources(env, "AWS::Lambda::Function")
    steps = {f"sluice_handlers.{step}.handler" for step in FUNCTION_PLACEHOLDERS}
    ours = {k for k, f in functions.items() if f["Properties"].get("Handler", "") in steps}
    # the webhook Lambda is API Gateway's to call, not the workflow's
    assert any(f["Properties"].get("Handler") == "sluice_handlers.webhook.handler" for f in functions.values())
    invoke = [s for s in _workflow_statements(synthesis, env) if s["Action"] == "lambda:InvokeFunction"]
    (statement,) = invoke
    # the definition invokes each function by its unqualified ARN: no version or alias (`:*`)
    assert sorted(_resources(statement)) == sorted(f"<{k}.Arn>" for k in ours)


def test_workflow_role_can_run_its_distributed_map(synthesis: Synthesis, env: str) -> None:
    statements = _workflow_statements(synthesis, env)
    by_action: dict[str, list[str]] = {}
    for statement in statements:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        for action in actions:
            by_action.setdefault(action, []).extend(_resources(statement))
    prefix = "arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>"
    name = f"sluice-{env}-{STACK_INSTANCE}"
    assert by_action["states:StartExecution"] == [f"{prefix}:stateMachine:{name}"]
    executions = [f"{prefix}:execution:{name}/*", f"{prefix}:execution:{name}:*"]
    assert sorted(by_action["states:DescribeExecution"]) == sorted(executions)
    assert sorted(by_action["states:StopExecution"]) == sorted(executions)
    (bucket,) = [b for b in by_action["s3:GetObject"]]
    assert re.fullmatch(r"<StorageBucket\w+\.Arn>/jobs/\*", bucket)


def test_outputs_let_a_cli_find_the_environment(synthesis: Synthesis, env: str) -> None:
    outputs = synthesis.raw[env]["Outputs"]
    for name in ("BucketName", "TableName", "StateMachineArn", "ApiKeySecretArn", "WebhookUrl", "WebhookSecretArn"):
        assert name in outputs
        assert "Export" not in outputs[name]
    assert synthesis.stacks[env].stack_name == f"Sluice-{env}"


def test_the_local_run_executes_the_deployed_definition(synthesis: Synthesis, env: str) -> None:
    """`sluice run` must run what `cdk deploy` ships: same document once the ARNs are filled in."""
    from sluice.contract import STEPS
    from sluice.contract.definition import substitute

    from sluice_local.cloud import function_arn, local_definition

    _, machine = _only(synthesis.resources(env, "AWS::StepFunctions::StateMachine"))
    functions = synthesis.resources(env, "AWS::Lambda::Function")
    by_handler = {}
    for placeholder, value in machine["Properties"]["DefinitionSubstitutions"].items():
        handler = functions[value["Fn::GetAtt"][0]]["Properties"]["Handler"]
        module = handler.removesuffix(".handler")
        step = next(name for name, step in STEPS.items() if step.module == module)
        by_handler[placeholder] = function_arn(step)
    deployed = substitute(machine["Properties"]["DefinitionString"], by_handler)
    assert deployed == local_definition()
