"""How the stack writes a grant: one IAM statement at a time, each resource with a wildcard saying
why (and acknowledged for cdk-nag under that reason), to a role or to the roles of named steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import aws_cdk as cdk
import aws_cdk.aws_iam as iam
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_s3 as s3

from infra.checks import acknowledge, acknowledge_actions, spelled


class Grants:
    """The statements the stack adds: to `bucket`'s objects by prefix, and to the functions of
    `by_step`; an imported secret under `secrets_kms_key_arn` is decrypted only through Secrets Manager."""

    def __init__(
        self,
        stack: cdk.Stack,
        *,
        bucket: s3.IBucket,
        by_step: Mapping[str, lambda_.Function],
        secrets_kms_key_arn: str | None,
    ) -> None:
        self.stack = stack
        self.bucket = bucket
        self.by_step = by_step
        self.secrets_kms_key_arn = secrets_kms_key_arn

    def objects(self, *prefixes: str) -> list[str]:
        return [self.bucket.arn_for_objects(f"{prefix}*") for prefix in prefixes]

    def allow(
        self,
        role: iam.IRole,
        actions: list[str],
        resources: list[str],
        *,
        conditions: dict[str, object] | None = None,
        wildcard_reason: str | None = None,
    ) -> None:
        """Adds one statement; a resource with a wildcard must say why, and is acknowledged for cdk-nag."""
        role.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=resources, conditions=conditions))
        for resource in resources:
            pattern = spelled(self.stack, resource)
            if "*" in pattern:
                if not wildcard_reason:
                    raise ValueError(f"{pattern} has a wildcard; say why with wildcard_reason")
                if pattern == "*":
                    acknowledge_actions(role, actions, wildcard_reason)
                else:
                    acknowledge(role, f"AwsSolutions-IAM5[Resource::{pattern}]", wildcard_reason)

    def allow_secret_decrypt(self, role: iam.IRole | None, secret_arn: str) -> None:
        """An imported secret under a customer managed key: Decrypt, only through Secrets Manager, for it."""
        key = self.secrets_kms_key_arn
        if not key:
            return  # aws/secretsmanager: Secrets Manager's own key needs no grant
        assert role is not None
        self.allow(
            role,
            ["kms:Decrypt"],
            [key],
            conditions={
                "StringEquals": {
                    "kms:ViaService": f"secretsmanager.{self.stack.region}.amazonaws.com",
                    "kms:EncryptionContext:SecretARN": secret_arn,
                }
            },
        )

    def allow_steps(
        self,
        names: Sequence[str],
        actions: list[str],
        resources: list[str],
        *,
        conditions: dict[str, object] | None = None,
        wildcard_reason: str | None = None,
    ) -> None:
        """`allow` for each of the steps `names`, to its function's role."""
        for name in names:
            role = self.by_step[name].role
            assert role is not None
            self.allow(role, actions, resources, conditions=conditions, wildcard_reason=wildcard_reason)
