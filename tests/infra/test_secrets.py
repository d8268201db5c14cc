from __future__ import annotations

import copy

import aws_cdk as cdk
from aws_cdk import assertions

from infra.secrets import API_KEY_PLACEHOLDER
from infra.stack import build_app
from tests.infra.conftest import CONTEXT, Synthesis

EXISTING = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:sluice/openai-AbCdEf"


def test_created_secret_holds_only_a_placeholder(synthesis: Synthesis, env: str) -> None:
    (secret,) = synthesis.resources(env, "AWS::SecretsManager::Secret").values()
    assert secret["Properties"]["Name"] == f"sluice/{env}/provider-api-key"
    assert secret["Properties"]["SecretString"] == API_KEY_PLACEHOLDER


def test_existing_secret_is_referenced_by_arn() -> None:
    context = copy.deepcopy(CONTEXT)
    context["environments"]["dev"]["api_key_secret_arn"] = EXISTING
    app = cdk.App(context={**context, "aws:cdk:bundling-stacks": []})
    stack = build_app(app, ["dev"])["dev"]
    template = assertions.Template.from_stack(stack)

    template.resource_count_is("AWS::SecretsManager::Secret", 0)
    assert template.to_json()["Outputs"]["ApiKeySecretArn"]["Value"] == EXISTING
    functions = template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": "handlers.run_shard.handler"}}
    )
    (run_shard,) = functions.values()
    assert run_shard["Properties"]["Environment"]["Variables"]["SLUICE_API_KEY_SECRET_ARN"] == EXISTING
    statements = [
        s
        for p in template.find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    assert {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": EXISTING} in statements
