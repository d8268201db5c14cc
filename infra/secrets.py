"""The provider API key, kept in Secrets Manager so only its ARN ever reaches a Lambda."""

from __future__ import annotations

import aws_cdk as cdk
import aws_cdk.aws_secretsmanager as secretsmanager
from constructs import Construct

API_KEY_PLACEHOLDER = "PLACEHOLDER: set the provider API key with aws secretsmanager put-secret-value"


class Secrets(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        env_name: str,
        api_key_secret_arn: str | None,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        self.api_key: secretsmanager.ISecret
        if api_key_secret_arn:
            self.api_key = secretsmanager.Secret.from_secret_complete_arn(self, "ApiKey", api_key_secret_arn)
            self.created = False
        else:
            # Secrets Manager cannot hold an empty value, so the secret starts as a known,
            # non-secret placeholder; the user sets the real key with `put-secret-value`, and
            # the key itself never appears in a template.
            self.api_key = secretsmanager.Secret(
                self,
                "ApiKey",
                secret_name=f"sluice/{env_name}/provider-api-key",
                description=f"Sluice {env_name}: API key for the LLM provider (set it with put-secret-value).",
                secret_string_value=cdk.SecretValue.unsafe_plain_text(API_KEY_PLACEHOLDER),
                removal_policy=removal_policy,
            )
            self.created = True
