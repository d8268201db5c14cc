"""The webhook endpoint: HTTP API, its one route and integration, throttling, access logs, outputs."""

from __future__ import annotations

import json
from typing import Any

from tests.infra.conftest import Synthesis
from tests.infra.helpers.workflow import _flat


def _only(resources: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (item,) = resources.items()
    return item


def test_one_http_api_with_only_post_webhooks_to_the_webhook_lambda(synthesis: Synthesis, env: str) -> None:
    api_id, api = _only(synthesis.resources(env, "AWS::ApiGatewayV2::Api"))
    assert api["Properties"]["ProtocolType"] == "HTTP"
    assert "DisableExecuteApiEndpoint" not in api["Properties"]
    _, route = _only(synthesis.resources(env, "AWS::ApiGatewayV2::Route"))
    assert route["Properties"]["RouteKey"] == "POST /webhooks"
    assert route["Properties"]["ApiId"] == {"Ref": api_id}
    integration_id, integration = _only(synthesis.resources(env, "AWS::ApiGatewayV2::Integration"))
    assert _flat(route["Properties"]["Target"]) == f"integrations/<{integration_id}>"
    props = integration["Properties"]
    assert props["IntegrationType"] == "AWS_PROXY"
    assert props["PayloadFormatVersion"] == "2.0"
    function_id, attribute = props["IntegrationUri"]["Fn::GetAtt"]
    assert attribute == "Arn"
    function = synthesis.raw[env]["Resources"][function_id]["Properties"]
    assert function["Handler"] == "sluice_handlers.webhook.handler"
    assert function["Runtime"] == "python3.12"
    # answers well inside API Gateway's integration timeout
    assert function["Timeout"] * 1000 < props["TimeoutInMillis"] <= 30_000


def test_stage_is_throttled_as_configured_and_logs_every_request(synthesis: Synthesis, env: str) -> None:
    config = synthesis.stacks[env].config
    _, stage = _only(synthesis.resources(env, "AWS::ApiGatewayV2::Stage"))
    props = stage["Properties"]
    assert props["StageName"] == "$default"
    assert props["AutoDeploy"] is True
    assert props["DefaultRouteSettings"]["ThrottlingRateLimit"] == config.webhook_rate_limit
    assert props["DefaultRouteSettings"]["ThrottlingBurstLimit"] == config.webhook_burst_limit
    # a background job sends a webhook a request: at the provider's 30,000 RPM, 500 a second; the
    # endpoint takes twice that, in bursts of twice that again
    assert config.provider_rpm == 30_000
    assert (config.webhook_rate_limit, config.webhook_burst_limit) == (1000, 2000)
    assert config.webhook_rate_limit >= config.provider_rpm / 60

    log_group_id, attribute = props["AccessLogSettings"]["DestinationArn"]["Fn::GetAtt"]
    assert attribute == "Arn"
    log_group = synthesis.raw[env]["Resources"][log_group_id]
    assert log_group["Properties"]["RetentionInDays"] == config.log_retention_days
    access_log = json.loads(props["AccessLogSettings"]["Format"])
    assert {"requestId", "status", "routeKey", "integrationLatency"} <= set(access_log)
    # no header (the signature) and no body ever reach the access log
    assert not any("header" in v.lower() or "body" in v.lower() for v in access_log.values())


def test_outputs_give_the_full_webhook_url_and_the_secret_arn(synthesis: Synthesis, env: str) -> None:
    outputs = synthesis.raw[env]["Outputs"]
    api_id, _ = _only(synthesis.resources(env, "AWS::ApiGatewayV2::Api"))
    assert _flat(outputs["WebhookUrl"]["Value"]) == f"<{api_id}.ApiEndpoint>/webhooks"
    secrets = synthesis.resources(env, "AWS::SecretsManager::Secret")
    (webhook_secret,) = [
        k for k, s in secrets.items() if _flat(s["Properties"]["Name"]).endswith("/webhook-signing-secret")
    ]
    assert outputs["WebhookSecretArn"]["Value"] == {"Ref": webhook_secret}
