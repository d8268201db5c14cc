from __future__ import annotations

import copy

import aws_cdk as cdk
from aws_cdk import assertions

from infra.secrets import API_KEY_PLACEHOLDER, WEBHOOK_SECRET_PLACEHOLDER
from infra.stack import build_app
from tests.infra.conftest import CONTEXT, Synthesis

EXISTING = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:sluice/openai-AbCdEf"
EXISTING_WEBHOOK = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:sluice/openai-webhook-GhIjKl"


def test_created_secrets_hold_only_placeholders(synthesis: Synthesis, env: str) -> None:
    secrets = {s["Properties"]["Name"]: s for s in synthesis.resources(env, "AWS::SecretsManager::Secret").values()}
    assert set(secrets) == {f"sluice/{env}/provider-api-key", f"sluice/{env}/webhook-signing-secret"}
    assert secrets[f"sluice/{env}/provider-api-key"]["Properties"]["SecretString"] == API_KEY_PLACEHOLDER
    webhook = secrets[f"sluice/{env}/webhook-signing-secret"]["Properties"]["SecretString"]
    # not a whsec_ value: until the real secret is set, every delivery fails verification
    assert webhook == WEBHOOK_SECRET_PLACEHOLDER and not webhook.startswith("whsec_")


def test_existing_secrets_are_referenced_by_arn() -> None:
    context = copy.deepcopy(CONTEXT)
    context["environments"]["dev"]["api_key_secret_arn"] = EXISTING
    context["environments"]["dev"]["webhook_secret_arn"] = EXISTING_WEBHOOK
    app = cdk.App(context={**context, "aws:cdk:bundling-stacks": []})
    stack = build_app(app, ["dev"])["dev"]
    template = assertions.Template.from_stack(stack)

    template.resource_count_is("AWS::SecretsManager::Secret", 0)
    outputs = template.to_json()["Outputs"]
    assert outputs["ApiKeySecretArn"]["Value"] == EXISTING
    assert outputs["WebhookSecretArn"]["Value"] == EXISTING_WEBHOOK
    functions = template.find_resources("AWS::Lambda::Function")
    by_handler = {f["Properties"].get("Handler"): f for f in functions.values()}
    run_shard = by_handler["handlers.run_shard.handler"]
    assert run_shard["Properties"]["Environment"]["Variables"]["SLUICE_API_KEY_SECRET_ARN"] == EXISTING
    webhook = by_handler["handlers.webhook.handler"]
    assert webhook["Properties"]["Environment"]["Variables"]["SLUICE_WEBHOOK_SECRET_ARN"] == EXISTING_WEBHOOK
    statements = [
        s
        for p in template.find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    assert {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": EXISTING} in statements
    assert {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": EXISTING_WEBHOOK} in statements
