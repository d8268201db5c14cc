"""What test_security.py and the tests beside it share."""

from __future__ import annotations

from typing import Any

from tests.infra.conftest import Synthesis


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    return _listed(document["Statement"])


def _role_statements(synthesis: Synthesis, env: str, function: dict[str, Any]) -> list[dict[str, Any]]:
    policies = synthesis.resources(env, "AWS::IAM::Policy").values()
    role_id = function["Properties"]["Role"]["Fn::GetAtt"][0]
    role = synthesis.raw[env]["Resources"][role_id]
    assert not role["Properties"].get("ManagedPolicyArns") and not role["Properties"].get("Policies")
    return [
        statement
        for policy in policies
        if {"Ref": role_id} in policy["Properties"]["Roles"]
        for statement in _statements(policy["Properties"]["PolicyDocument"])
    ]
