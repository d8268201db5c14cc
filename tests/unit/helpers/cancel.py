"""What test_cancel.py and the tests beside it share."""

from __future__ import annotations

import json
from typing import Any

import boto3
import orjson
from sluice.contract import Settings
from sluice.plan.plan import plan_job
from sluice.store.jobs import JobStore

from sluice_local.cloud import create_table

REGION = "us-east-1"
BUCKET = "jobs-bucket"


class Aws:
    def __init__(self, base_url: str) -> None:
        self.s3 = boto3.client("s3", region_name=REGION)
        self.sfn = boto3.client("stepfunctions", region_name=REGION)
        self.s3.create_bucket(Bucket=BUCKET)
        create_table(boto3.client("dynamodb", region_name=REGION), "jobs")
        self.store = JobStore(boto3.resource("dynamodb", region_name=REGION).Table("jobs"), ttl_days=1)
        self.machine = self.sfn.create_state_machine(
            name="jobs",
            definition=json.dumps(
                {"StartAt": "Wait", "States": {"Wait": {"Type": "Wait", "Seconds": 3600, "End": True}}}
            ),
            roleArn="arn:aws:iam::123456789012:role/jobs",
        )["stateMachineArn"]
        self.settings = Settings(
            bucket=BUCKET,
            table="jobs",
            provider_base_url=base_url,
            api_key_secret_arn="-",
            shard_lines=5,
            request_timeout_s=5.0,
        )

    def upload(self, key: str, lines: list[bytes]) -> str:
        return str(self.s3.put_object(Bucket=BUCKET, Key=key, Body=b"".join(lines))["ETag"]).strip('"')

    def execution(self) -> str:
        return str(self.sfn.start_execution(stateMachineArn=self.machine, input="{}")["executionArn"])

    def plan(self, key: str, lines: list[bytes]) -> dict[str, Any]:
        etag = self.upload(key, lines)
        return plan_job(
            s3=self.s3,
            store=self.store,
            settings=self.settings,
            bucket=BUCKET,
            key=key,
            etag=etag,
            execution=self.execution(),
        ).to_dict()

    def read_lines(self, key: str) -> list[dict[str, Any]]:
        return [orjson.loads(r) for r in self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().splitlines()]
