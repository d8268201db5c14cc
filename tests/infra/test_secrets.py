from __future__ import annotations

import copy

import aws_cdk as cdk
from aws_cdk import assertions

from infra.secrets import API_KEY_PLACEHOLDER, WEBHOOK_SECRET_PLACEHOLDER
from infra.stack import build_app
from tests.infra.conftest import CONTEXT, Synthesis
from tests.infra.helpers.workflow import STACK_INSTANCE, _flat

EXISTING = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:sluice/openai-AbCdEf"
EXISTING_WEBHOOK = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:sluice/openai-webhook-GhIjKl"


def test_created_secrets_hold_only_placeholders(synthesis: Synthesis, env: str) -> None:
    secrets = {
        _flat(s["Properties"]["Name"]): s for s in synthesis.resources(env, "AWS::SecretsManager::Secret").values()
    }
    prefix = f"sluice/{env}/{STACK_INSTANCE}"
    assert set(secrets) == {f"{prefix}/provider-api-key", f"{prefix}/webhook-signing-secret"}
    assert secrets[f"{prefix}/provider-api-key"]["Properties"]["SecretString"] == API_KEY_PLACEHOLDER
    webhook = secrets[f"{prefix}/webhook-signing-secret"]["Properties"]["SecretString"]
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
    run_shard = by_handler["sluice_handlers.run_shard.handler"]
    assert run_shard["Properties"]["Environment"]["Variables"]["SLUICE_API_KEY_SECRET_ARN"] == EXISTING
    webhook = by_handler["sluice_handlers.webhook.handler"]
    assert webhook["Properties"]["Environment"]["Variables"]["SLUICE_WEBHOOK_SECRET_ARN"] == EXISTING_WEBHOOK
    statements = [
        s
        for p in template.find_resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    assert {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": EXISTING} in statements
    assert {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": EXISTING_WEBHOOK} in statements


KEY = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def _decrypt_by_handler(api_key: str | None, webhook: str | None, key: str | None) -> dict[str, list[dict]]:
    """The kms:Decrypt statements of each function's role, by handler."""
    context = copy.deepcopy(CONTEXT)
    dev = context["environments"]["dev"]
    dev.update(api_key_secret_arn=api_key, webhook_secret_arn=webhook, secrets_kms_key_arn=key)
    app = cdk.App(context={**context, "aws:cdk:bundling-stacks": []})
    template = assertions.Template.from_stack(build_app(app, ["dev"])["dev"]).to_json()
    resources = template["Resources"]
    handler_by_role = {
        f["Properties"]["Role"]["Fn::GetAtt"][0]: f["Properties"]["Handler"].split(".")[1]
        for f in resources.values()
        if f["Type"] == "AWS::Lambda::Function" and f["Properties"].get("Handler", "").startswith("sluice_handlers.")
    }
    found: dict[str, list[dict]] = {}
    for policy in resources.values():
        if policy["Type"] != "AWS::IAM::Policy":
            continue
        for role in policy["Properties"]["Roles"]:
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                if any(a.startswith("kms:") for a in actions) and role["Ref"] in handler_by_role:
                    found.setdefault(handler_by_role[role["Ref"]], []).append(statement)
    return found


def test_imported_secrets_under_a_customer_key_can_be_decrypted_by_exactly_their_readers() -> None:
    found = _decrypt_by_handler(EXISTING, EXISTING_WEBHOOK, KEY)
    # the steps that send, and those that cancel a failed shard's or job's open work
    key_readers = {"run_shard", "submit", "collect", "submit_batch", "collect_batch", "fail_shard", "mark_failed"}
    assert set(found) == key_readers | {"webhook"}
    for handler, statements in found.items():
        secret = EXISTING_WEBHOOK if handler == "webhook" else EXISTING
        assert statements == [
            {
                "Action": "kms:Decrypt",
                "Effect": "Allow",
                "Resource": KEY,
                "Condition": {
                    "StringEquals": {
                        "kms:ViaService": {
                            "Fn::Join": ["", ["secretsmanager.", {"Ref": "AWS::Region"}, ".amazonaws.com"]]
                        },
                        "kms:EncryptionContext:SecretARN": secret,
                    }
                },
            }
        ], handler


def test_decrypt_only_for_the_secrets_that_are_imported_and_only_with_a_key() -> None:
    only_api_key = _decrypt_by_handler(EXISTING, None, KEY)
    assert set(only_api_key) == {
        "run_shard",
        "submit",
        "collect",
        "submit_batch",
        "collect_batch",
        "fail_shard",
        "mark_failed",
    }
    assert _decrypt_by_handler(EXISTING, EXISTING_WEBHOOK, None) == {}
