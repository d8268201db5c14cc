"""What cli.py and the tests beside it share."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest

from sluice_local.cloud import create_table

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
BUCKET = "sluice-dev-bucket"
TABLE = "sluice-dev-jobs"


def sluice(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice_local.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything AWS, so the user's real setup never leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and not k.startswith("OPENAI_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@dataclass
class Deployed:
    endpoint: str
    sim: Any
    secret_arn: str
    state_machine_arn: str
    env: dict[str, str]

    @property
    def s3(self) -> Any:
        return boto3.client("s3", region_name=REGION)

    @property
    def sfn(self) -> Any:
        return boto3.client("stepfunctions", region_name=REGION)

    @property
    def table(self) -> Any:
        return boto3.resource("dynamodb", region_name=REGION).Table(TABLE)

    @property
    def store(self) -> Any:
        from sluice.store.jobs import JobStore

        return JobStore(self.table, ttl_days=7)

    def settings(self, **changes: Any) -> Any:
        from sluice.contract import Settings

        options = {
            "shard_lines": 10,
            "concurrency": 20,
            "map_concurrency": 4,
            "request_timeout_s": 5.0,
            "poll_seconds": 1,
            **changes,
        }
        return Settings(
            bucket=BUCKET,
            table=TABLE,
            provider_base_url=self.sim.base_url,
            api_key_secret_arn=self.secret_arn,
            **options,
        )

    def cli(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return sluice(*args, "--env", "dev", env=self.env, timeout=timeout)

    # -- the pipeline, as the deployed Lambdas run it

    def start(self, key: str, **settings: Any) -> dict[str, Any]:
        """What the EventBridge rule and Plan do for a new object: an execution and a plan."""
        from sluice.plan.plan import plan_job

        etag = self.s3.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"')
        event = {
            "detail-type": "Object Created",
            "detail": {"bucket": {"name": BUCKET}, "object": {"key": key, "etag": etag}},
        }
        execution = self.sfn.start_execution(stateMachineArn=self.state_machine_arn, input=json.dumps(event))[
            "executionArn"
        ]
        return plan_job(
            s3=self.s3,
            store=self.store,
            settings=self.settings(**settings),
            bucket=BUCKET,
            key=key,
            etag=etag,
            execution=execution,
        ).to_dict()

    def specs(self, state: dict[str, Any]) -> list[Any]:
        from sluice.merge.merge import load_manifest

        return load_manifest(self.s3, BUCKET, state["manifest_key"])

    def context(self, **settings: Any) -> Any:
        from sluice.send.engine import make_session
        from sluice.shard.frame import ShardContext

        return ShardContext(
            s3=self.s3,
            store=self.store,
            settings=self.settings(**settings),
            api_key="sk-test",
            remaining_s=lambda: 900.0,
            session_factory=make_session,
        )

    def run_shard(self, spec: Any) -> None:
        from sluice.runners.direct import run_direct

        assert asyncio.run(run_direct(self.context(), spec)).done

    def merge(self, state: dict[str, Any]) -> dict[str, Any]:
        from sluice.contract import Planned
        from sluice.merge.merge import merge_job

        return merge_job(s3=self.s3, store=self.store, state=Planned.from_dict(state)).to_json()


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


def errors_of(deployed: Deployed, key: str) -> list[dict[str, Any]]:
    return [orjson.loads(e) for e in deployed.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().splitlines()]
