"""The webhook endpoint: an HTTP API with one route, `POST /webhooks`, to the webhook Lambda.

The provider signs every delivery (Standard Webhooks: HMAC-SHA256 over id, timestamp and body
with the `whsec_` secret); the Lambda verifies that before anything else, so the route has no
authorizer. Throttling caps what a flood can cost, and access logs record every request's
status and latency, never its headers or body.
"""

from __future__ import annotations

import json

import aws_cdk as cdk
import aws_cdk.aws_apigateway as apigateway
import aws_cdk.aws_apigatewayv2 as apigwv2
import aws_cdk.aws_apigatewayv2_integrations as integrations
import aws_cdk.aws_lambda as lambda_
import aws_cdk.aws_logs as logs
import jsii
from constructs import Construct

WEBHOOK_PATH = "/webhooks"

# HTTP API context variables only: no headers, no body, no query string.
ACCESS_LOG_FORMAT = {
    "requestId": "$context.requestId",
    "ip": "$context.identity.sourceIp",
    "requestTime": "$context.requestTime",
    "httpMethod": "$context.httpMethod",
    "routeKey": "$context.routeKey",
    "status": "$context.status",
    "protocol": "$context.protocol",
    "responseLength": "$context.responseLength",
    "responseLatency": "$context.responseLatency",
    "integrationStatus": "$context.integrationStatus",
    "integrationLatency": "$context.integrationLatency",
    "integrationError": "$context.integrationErrorMessage",
    "error": "$context.error.message",
}


class Webhooks(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        env_name: str,
        function: lambda_.IFunction,
        rate_limit: int,
        burst_limit: int,
        log_retention: logs.RetentionDays,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, id)
        self.access_logs = logs.LogGroup(
            self,
            "AccessLogs",
            retention=log_retention,
            removal_policy=removal_policy,
        )
        self.api = apigwv2.HttpApi(
            self,
            "Api",
            api_name=f"sluice-{env_name}-webhooks",
            description=f"Sluice {env_name}: provider webhooks (signed; verified by the Lambda)",
            create_default_stage=False,
        )
        self.stage = self.api.add_stage(
            "DefaultStage",
            stage_name="$default",
            auto_deploy=True,
            throttle=apigwv2.ThrottleSettings(rate_limit=rate_limit, burst_limit=burst_limit),
            access_log_settings=_AccessLogSettings(
                apigwv2.LogGroupLogDestination(self.access_logs),
                apigateway.AccessLogFormat.custom(json.dumps(ACCESS_LOG_FORMAT, separators=(",", ":"))),
            ),
        )
        (self.route,) = self.api.add_routes(
            path=WEBHOOK_PATH,
            methods=[apigwv2.HttpMethod.POST],
            integration=integrations.HttpLambdaIntegration(
                "Receiver",
                function,
                payload_format_version=apigwv2.PayloadFormatVersion.VERSION_2_0,
                timeout=cdk.Duration.seconds(15),
            ),
        )
        # `$default` serves at the root: no stage segment in the URL the provider is given.
        self.url = f"{self.api.api_endpoint}{WEBHOOK_PATH}"


@jsii.implements(apigwv2.IAccessLogSettings)
class _AccessLogSettings:
    """`IAccessLogSettings` is a jsii interface; its two properties are all there is to it."""

    def __init__(self, destination: apigwv2.IAccessLogDestination, format: apigateway.AccessLogFormat) -> None:
        self._destination = destination
        self._format = format

    @property
    def destination(self) -> apigwv2.IAccessLogDestination:
        return self._destination

    @property
    def format(self) -> apigateway.AccessLogFormat:
        return self._format
