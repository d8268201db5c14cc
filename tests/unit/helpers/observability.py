"""What test_observability.py and the tests beside it share."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Iterator
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.store.jobs import ItemState, JobStore
from sluice_handlers import webhook

from sluice_local.cloud import LambdaContext, LocalCloud
from tests.conftest import plan_figures

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


def signed(body: bytes, *, secret: str = SECRET, msg_id: str = "msg_1") -> dict[str, str]:
    ts = int(time.time())
    mac = hmac.new(base64.b64decode(secret.removeprefix("whsec_")), f"{msg_id}.{ts}.".encode() + body, hashlib.sha256)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode(),
        "content-type": "application/json",
    }


def api_event(body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    """What API Gateway (HTTP API, payload 2.0) hands the Lambda."""
    return {
        "version": "2.0",
        "routeKey": "POST /webhooks",
        "rawPath": "/webhooks",
        "headers": headers,
        "requestContext": {"http": {"method": "POST", "path": "/webhooks", "sourceIp": "192.0.2.1"}},
        "body": body.decode(),
        "isBase64Encoded": False,
    }


def provider_event(kind: str, provider_id: str, text: str = "the customer's private words") -> bytes:
    return orjson.dumps(
        {"id": "evt_1", "object": "event", "created_at": 1, "type": kind, "data": {"id": provider_id, "note": text}}
    )


@pytest.fixture
def deployed_webhook(monkeypatch: pytest.MonkeyPatch) -> Iterator[JobStore]:
    """The webhook handler against moto, with one submitted response and one batch to settle."""
    with mock_aws():
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        cloud = LocalCloud(provider_base_url="http://unused", api_key="sk-unused")
        cloud.webhook_secret = SECRET
        cloud._create_resources()
        monkeypatch.setenv("SLUICE_TABLE", cloud.table_name)
        monkeypatch.setenv("SLUICE_WEBHOOK_SECRET_ARN", cloud.webhook_secret_arn)
        monkeypatch.setenv("SLUICE_TTL_DAYS", "1")
        webhook._clients.cache_clear()
        store = JobStore(boto3.resource("dynamodb").Table(cloud.table_name), ttl_days=1)
        store.record_plan("job", plan=plan_figures(1), shards=[(0, 1, 1), (1, 1, 1)], mode="background")
        store.record_progress(
            "job", 0, [ItemState(1, "a", "submitted", "resp_a")], done=0, failed=0, finished=False, run=1, waiting=1
        )
        store.set_shard_batches("job", 1, ["batch_1"])
        try:
            yield store
        finally:
            webhook._clients.cache_clear()


def call(body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    return webhook.handler(api_event(body, headers), LambdaContext("sluice-webhook", 10))
