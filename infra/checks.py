"""cdk-nag's AwsSolutions checks, with the wildcard-resource finding told apart by action.

cdk-nag reports an IAM statement on every resource (`"Resource": "*"`) as one finding per policy,
`AwsSolutions-IAM5[Resource::*]`, whatever the actions: acknowledging it for X-Ray's two actions
would also hide the next statement anyone adds on "*". Here that finding stands only for the
actions not acknowledged one by one as `AwsSolutions-IAM5[Action::<action>]` on the policy or a
construct above it (its role, say), and is reported under each such action's name. Every other
finding, and every other resource pattern (`<Bucket.Arn>/jobs/*`), is cdk-nag's as it stands.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import jsii
from cdk_nag import AwsSolutionsChecks
from constructs import IConstruct

WILDCARD_FINDING = "AwsSolutions-IAM5[Resource::*]"


def action_finding(action: str) -> str:
    """The acknowledgement, and the finding, of one action granted on every resource."""
    return f"AwsSolutions-IAM5[Action::{action}]"


def acknowledge(construct: IConstruct, rule: str, reason: str) -> None:
    """Records a deliberate cdk-nag (AwsSolutions) finding, with the reason, on the construct."""
    cdk.Validations.of(construct).acknowledge(cdk.Acknowledgment(id=rule, reason=reason))


def acknowledge_actions(construct: IConstruct, actions: Sequence[str], reason: str) -> None:
    """Actions granted on every resource, each acknowledged by name: a statement on "*" with any
    other action is still a finding."""
    for action in actions:
        acknowledge(construct, action_finding(action), reason)


def spelled(stack: cdk.Stack, arn: str) -> str:
    """An ARN as cdk-nag spells it in a finding: `<Logical.Arn>/jobs/*`, `<AWS::Region>`."""
    resolved = stack.resolve(arn)
    parts = resolved["Fn::Join"][1] if isinstance(resolved, dict) and "Fn::Join" in resolved else [resolved]
    found = []
    for part in parts:
        if isinstance(part, str):
            found.append(part)
        elif "Ref" in part:
            found.append(f"<{part['Ref']}>")
        elif "Fn::GetAtt" in part:
            found.append("<{}.{}>".format(*part["Fn::GetAtt"]))
        else:  # e.g. the stack's instance id in a name (`stack_instance_id`): cdk-nag prints the JSON
            found.append(json.dumps(part, separators=(",", ":")))
    return "".join(found)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _documents(resource: IConstruct) -> Iterator[dict[str, Any]]:
    stack = cdk.Stack.of(resource)
    if isinstance(resource, iam.CfnPolicy | iam.CfnManagedPolicy):
        yield stack.resolve(resource.policy_document)
    elif isinstance(resource, iam.CfnRole | iam.CfnUser | iam.CfnGroup):
        for policy in _listed(stack.resolve(resource.policies) or []):
            yield stack.resolve(policy)["policyDocument"]


def actions_on_every_resource(resource: IConstruct) -> list[str]:
    """The actions a policy (or an entity's inline policies) allows on "*", in order."""
    actions: list[str] = []
    for document in _documents(resource):
        for statement in _listed(document.get("Statement", [])):
            if statement.get("Effect") == "Allow" and "*" in _listed(statement.get("Resource")):
                actions.extend(a for a in _listed(statement.get("Action", [])) if a not in actions)
    return actions


def acknowledged(construct: IConstruct, finding: str) -> bool:
    """Whether `finding` was acknowledged on the construct or any above it (`Validations.acknowledge`)."""
    key = cdk.Validations.ACKNOWLEDGED_RULES_METADATA_KEY
    scope: IConstruct | None = construct
    while scope is not None:
        for entry in scope.node.metadata:
            # aws-cdk-lib writes the ids as `Annotation::<id>`
            ids = entry.data if entry.type == key and isinstance(entry.data, dict) else {}
            if any(k == finding or k.split("::", 1)[-1] == finding for k in ids):
                return True
        scope = scope.node.scope
    return False


def _find(app: IConstruct, path: str) -> IConstruct:
    construct = app
    for part in path.split("/"):
        construct = construct.node.find_child(part)
    return construct


@jsii.implements(cdk.IPolicyValidationPlugin)
class SecurityChecks:
    """Register with `cdk.Validations.of(app).add_plugins(SecurityChecks(app))`."""

    def __init__(self, app: cdk.App) -> None:
        self._app = app
        self._nag = AwsSolutionsChecks(app)

    @property
    def name(self) -> str:
        return self._nag.name

    @property
    def version(self) -> str | None:
        return self._nag.version

    @property
    def rule_ids(self) -> list[str] | None:
        return self._nag.rule_ids

    def validate(self, context: cdk.IPolicyValidationContext) -> cdk.PolicyValidationPluginReport:
        report = self._nag.validate(context)
        violations: list[cdk.PolicyViolation] = []
        for violation in report.violations:
            if violation.rule_name != WILDCARD_FINDING:
                violations.append(violation)
                continue
            by_action: dict[str, list[cdk.PolicyViolatingResource]] = {}
            for where in violation.violating_resources:
                resource = _find(self._app, str(where.construct_path))
                for action in actions_on_every_resource(resource):
                    if not acknowledged(resource, action_finding(action)):
                        by_action.setdefault(action, []).append(where)
            violations.extend(
                cdk.PolicyViolation(
                    rule_name=action_finding(action),
                    description=f'{action} is granted on every resource ("*") with no acknowledgement of why. '
                    + violation.description,
                    violating_resources=resources,
                    severity=violation.severity,
                )
                for action, resources in by_action.items()
            )
        return cdk.PolicyValidationPluginReport(
            success=not violations, violations=violations, plugin_version=report.plugin_version
        )
