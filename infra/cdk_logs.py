"""Log groups, with the environment's retention, for the Lambdas CDK adds to a stack on its own.

Bucket notifications, the auto-delete-objects provider and any other custom-resource provider are
Lambdas with no log group of their own: Lambda would create `/aws/lambda/<name>` the first time one
runs, kept forever. Each gets a log group here, which its `LoggingConfig` names, so it exists (with
its retention) before the function first runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import aws_cdk as cdk
import aws_cdk.aws_logs as logs
from constructs import Construct

LAMBDA_FUNCTION = "AWS::Lambda::Function"


class CdkLogs(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        functions: Sequence[cdk.CfnResource],
        retention: logs.RetentionDays,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        self.log_groups: dict[str, logs.LogGroup] = {}
        for function in functions:
            # named after where CDK put the function in the stack, e.g. BucketNotificationsHandler050a...
            path = function.node.path.split("/", 1)[-1].removesuffix("/Resource")
            name = re.sub(r"[^A-Za-z0-9]", "", path)
            group = logs.LogGroup(self, name, retention=retention, removal_policy=removal_policy)
            function.add_property_override("LoggingConfig.LogGroup", group.log_group_name)
            self.log_groups[name] = group


def cdk_functions(scope: Construct, ours: Sequence[Construct]) -> list[cdk.CfnResource]:
    """The Lambda functions under `scope` that are not among `ours` (which have their log groups)."""
    mine = {function.node.path for function in ours}
    return [
        child
        for child in scope.node.find_all()
        if isinstance(child, cdk.CfnResource)
        and child.cfn_resource_type == LAMBDA_FUNCTION
        and child.node.scope is not None
        and child.node.scope.node.path not in mine
    ]
