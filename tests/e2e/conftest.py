"""Fixtures of the e2e tests: moto in server mode, one per module (`moto_endpoint`), and on it the
resources of a deployed environment, fresh for each test (`deployed`)."""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from sluice_local.cloud import create_table
from tests.e2e.cli_env import BUCKET, REGION, TABLE, Deployed, clean_env


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def deployed(moto_endpoint: str, simulator: Any, monkeypatch: pytest.MonkeyPatch) -> Deployed:
    """Fresh resources per test, laid out as the CDK stack would, and found through its outputs."""
    urllib.request.urlopen(urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST"), timeout=10).read()
    aws = {
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for name, value in aws.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
    create_table(boto3.client("dynamodb", region_name=REGION), TABLE)
    secret_arn = boto3.client("secretsmanager", region_name=REGION).create_secret(
        Name="sluice-dev/provider-api-key", SecretString="sk-test"
    )["ARN"]
    # the real definition needs its Lambdas; this one only has to exist and keep running until stopped
    machine = boto3.client("stepfunctions", region_name=REGION).create_state_machine(
        name="sluice-dev-jobs",
        definition=json.dumps({"StartAt": "Wait", "States": {"Wait": {"Type": "Wait", "Seconds": 86400, "End": True}}}),
        roleArn="arn:aws:iam::123456789012:role/sluice-dev-workflow",
    )
    # the outputs infra/stack.py declares; the provider URL is only in the functions' environment
    outputs = {
        "BucketName": BUCKET,
        "TableName": TABLE,
        "StateMachineArn": machine["stateMachineArn"],
        "ApiKeySecretArn": secret_arn,
    }
    assume = {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    function = {
        "Runtime": "python3.12",
        "Handler": "sluice_handlers.run_shard.handler",
        "Role": {"Fn::GetAtt": ["ShardRole", "Arn"]},
        "Code": {"ZipFile": "def handler(event, context): ..."},
        "Environment": {"Variables": {"SLUICE_PROVIDER_BASE_URL": simulator.base_url}},
    }
    template = {
        "Resources": {
            "ShardRole": {
                "Type": "AWS::IAM::Role",
                "Properties": {"AssumeRolePolicyDocument": {"Version": "2012-10-17", "Statement": [assume]}},
            },
            "RunShard": {"Type": "AWS::Lambda::Function", "Properties": function},
        },
        "Outputs": {name: {"Value": value} for name, value in outputs.items()},
    }
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName="Sluice-dev", TemplateBody=json.dumps(template)
    )
    return Deployed(moto_endpoint, simulator, secret_arn, machine["stateMachineArn"], clean_env(**aws))
