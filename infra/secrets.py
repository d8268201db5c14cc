"""The provider API key and webhook signing secret, in Secrets Manager: only ARNs reach a Lambda."""

from __future__ import annotations

import aws_cdk as cdk
import aws_cdk.aws_secretsmanager as secretsmanager
from constructs import Construct

from infra.config import stack_instance_id

API_KEY_PLACEHOLDER = "PLACEHOLDER: set the provider API key with aws secretsmanager put-secret-value"
# Not a `whsec_` value, so the webhook Lambda rejects every delivery (401) until the real secret
# is set: webhooks only speed jobs up, and polling finishes them meanwhile.
WEBHOOK_SECRET_PLACEHOLDER = (
    "PLACEHOLDER: set the provider's webhook signing secret (whsec_...) with aws secretsmanager put-secret-value"
)


class Secrets(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        env_name: str,
        api_key_secret_arn: str | None,
        removal_policy: cdk.RemovalPolicy,
        webhook_secret_arn: str | None = None,
        api_key_needed: bool = True,
    ) -> None:
        super().__init__(scope, id)
        # unique to this stack: a retained secret, or one in its recovery window, keeps its name
        prefix = f"sluice/{env_name}/{stack_instance_id(self)}"
        # Secrets Manager cannot hold an empty value, so a created secret starts as a known,
        # non-secret placeholder; the user sets the real value with `put-secret-value`, and it
        # never appears in a template.
        # a provider that signs its requests with the functions' roles (Bedrock) has no key to hold
        self.api_key: secretsmanager.ISecret | None = None
        self.created = False
        if api_key_needed:
            self.api_key, self.created = self._secret(
                "ApiKey",
                api_key_secret_arn,
                name=f"{prefix}/provider-api-key",
                description=f"Sluice {env_name}: API key for the LLM provider (set it with put-secret-value).",
                placeholder=API_KEY_PLACEHOLDER,
                removal_policy=removal_policy,
            )
        self.webhook_secret, self.webhook_secret_created = self._secret(
            "WebhookSecret",
            webhook_secret_arn,
            name=f"{prefix}/webhook-signing-secret",
            description=(
                f"Sluice {env_name}: the provider's webhook signing secret, whsec_... (set it with put-secret-value)."
            ),
            placeholder=WEBHOOK_SECRET_PLACEHOLDER,
            removal_policy=removal_policy,
        )

    def _secret(
        self,
        id: str,
        arn: str | None,
        *,
        name: str,
        description: str,
        placeholder: str,
        removal_policy: cdk.RemovalPolicy,
    ) -> tuple[secretsmanager.ISecret, bool]:
        if arn:
            return secretsmanager.Secret.from_secret_complete_arn(self, id, arn), False
        secret = secretsmanager.Secret(
            self,
            id,
            secret_name=name,
            description=description,
            secret_string_value=cdk.SecretValue.unsafe_plain_text(placeholder),
            removal_policy=removal_policy,
        )
        return secret, True
