"""Invariant 5: no secret (API key, webhook secret) is logged or written to S3 or DynamoDB."""

from __future__ import annotations

import logging
from pathlib import Path

import boto3
import pytest

from sluice_local.cloud import REGION, LocalCloud, LocalSettings, run_job
from tests.conftest import request_line, write_jsonl

API_KEY = "sk-CANARY-0123456789abcdef"


@pytest.mark.parametrize("mode", ["direct", "background", "batch"])
def test_no_secret_reaches_s3_dynamodb_or_logs(
    simulator, tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str], mode: str
) -> None:
    # INFO is what the Lambdas run with; botocore at DEBUG prints request bodies, secrets included
    caplog.set_level(logging.INFO)
    settings = LocalSettings(concurrency=20, shard_lines=20, poll_seconds=1, retry_base_delay_s=0.05)
    cloud = LocalCloud(provider_base_url=simulator.base_url, api_key=API_KEY, settings=settings)
    with cloud.running():
        simulator.configure(webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret, rate_500=0.2)
        webhook_secret = cloud.webhook_secret
        lines = [request_line(f"k-{n}", url="/v1/responses") for n in range(40)] + [b"{broken\n"]
        run = run_job(cloud, write_jsonl(tmp_path / "secret.jsonl", lines), metadata={"sluice-mode": mode})
        assert run.status == "SUCCEEDED"
        assert run.verify(tmp_path / "secret.jsonl").ok

        s3 = boto3.client("s3", region_name=REGION)
        stored = b""
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=cloud.bucket):
            for obj in page.get("Contents", []):
                stored += s3.get_object(Bucket=cloud.bucket, Key=obj["Key"])["Body"].read()
                stored += obj["Key"].encode()
        rows = boto3.client("dynamodb", region_name=REGION).scan(TableName=cloud.table_name)["Items"]
    secrets = (API_KEY, webhook_secret, webhook_secret.removeprefix("whsec_"))
    out, err = capfd.readouterr()
    for secret in secrets:
        assert secret.encode() not in stored
        assert secret not in repr(rows)
        assert secret not in caplog.text
        assert secret not in out and secret not in err
    # the key did reach the provider, as a bearer token and nowhere else
    assert any(e["path"].startswith("/v1/") for e in simulator.log)
