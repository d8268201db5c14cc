"""Retained resources outlive their stack: none may carry a name the next stack would ask for again."""

from __future__ import annotations

import re
from typing import Any

from tests.infra.conftest import Synthesis

STACK_A = "arn:aws:cloudformation:eu-west-1:123456789012:stack/Sluice-prod/51af3dc0-da77-11e4-872e-1234567db123"
STACK_B = "arn:aws:cloudformation:eu-west-1:123456789012:stack/Sluice-prod/9c2e0a10-1f3b-11f1-9f4e-0a1b2c3d4e5f"


def _retained(resource: dict[str, Any]) -> bool:
    return "Retain" in (resource.get("DeletionPolicy"), resource.get("UpdateReplacePolicy"))


def _names(resource: dict[str, Any]) -> dict[str, Any]:
    """The physical-name properties: `StateMachineName`, `LogGroupName`, a secret's `Name`, ..."""
    return {k: v for k, v in resource.get("Properties", {}).items() if k == "Name" or k.endswith("Name")}


def resolve(value: Any, stack_id: str) -> Any:
    """What CloudFormation makes of a name in a stack with this id."""
    if isinstance(value, str | int):
        return value
    (function, arguments), *_ = value.items()
    if function == "Ref":
        pseudo = {"AWS::StackId": stack_id, "AWS::Region": "eu-west-1", "AWS::AccountId": "123456789012"}
        return pseudo[arguments]
    if function == "Fn::Join":
        return arguments[0].join(resolve(part, stack_id) for part in arguments[1])
    if function == "Fn::Split":
        return resolve(arguments[1], stack_id).split(arguments[0])
    if function == "Fn::Select":
        return resolve(arguments[1], stack_id)[int(arguments[0])]
    raise AssertionError(f"cannot resolve {value}")


def test_no_retained_resource_has_a_fixed_name(synthesis: Synthesis, env: str) -> None:
    for logical_id, resource in synthesis.raw[env]["Resources"].items():
        if not _retained(resource):
            continue
        for prop, value in _names(resource).items():
            assert not isinstance(value, str), f"{logical_id}.{prop} is fixed: {value!r}"
            first, second = resolve(value, STACK_A), resolve(value, STACK_B)
            assert first != second, f"{logical_id}.{prop} is the same in the next stack: {first!r}"


def test_the_named_resources_keep_a_readable_name_unique_to_the_stack(synthesis: Synthesis, env: str) -> None:
    named = {
        r["Type"]: resolve(v, STACK_A)
        for r in synthesis.raw[env]["Resources"].values()
        for v in _names(r).values()
        if r["Type"] in ("AWS::StepFunctions::StateMachine", "AWS::SecretsManager::Secret")
        or (r["Type"] == "AWS::Logs::LogGroup" and "LogGroupName" in r["Properties"])
    }
    assert named["AWS::StepFunctions::StateMachine"] == f"sluice-{env}-1234567db123"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,80}", named["AWS::StepFunctions::StateMachine"])
    assert named["AWS::Logs::LogGroup"] == f"/aws/vendedlogs/states/sluice-{env}-1234567db123"
    assert named["AWS::SecretsManager::Secret"].startswith(f"sluice/{env}/1234567db123/")
    if synthesis.stacks[env].config.removal_policy == "retain":
        retained = {r["Type"] for r in synthesis.raw[env]["Resources"].values() if _retained(r) and _names(r)}
        assert {"AWS::StepFunctions::StateMachine", "AWS::SecretsManager::Secret", "AWS::Logs::LogGroup"} <= retained


def test_the_cli_finds_the_state_machine_and_secrets_in_the_outputs(synthesis: Synthesis, env: str) -> None:
    outputs = synthesis.raw[env]["Outputs"]
    (machine,) = synthesis.resources(env, "AWS::StepFunctions::StateMachine")
    assert outputs["StateMachineArn"]["Value"] == {"Ref": machine}
    secrets = synthesis.resources(env, "AWS::SecretsManager::Secret")
    assert {outputs["ApiKeySecretArn"]["Value"]["Ref"], outputs["WebhookSecretArn"]["Value"]["Ref"]} == set(secrets)
    # `sluice submit` checks a job's options as Plan will, for the environment's provider family
    assert outputs["Provider"]["Value"] == synthesis.stacks[env].config.provider
