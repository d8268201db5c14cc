from __future__ import annotations

import base64
import functools
import json
import logging
import os
from typing import Any

import boto3
from botocore.exceptions import ClientError

from sluice.store import JobStore
from sluice.webhooks import handle_webhook

LOG = logging.getLogger("sluice.webhook")

# a token that timed out or was already used just means the shard woke some other way
_STALE_TOKEN_ERRORS = ("TaskTimedOut", "InvalidToken", "TaskDoesNotExist")


@functools.cache
def _clients() -> tuple[JobStore, Any, str]:
    table = os.environ.get("SLUICE_TABLE")
    secret_arn = os.environ.get("SLUICE_WEBHOOK_SECRET_ARN")
    if not table or not secret_arn:
        raise RuntimeError("SLUICE_TABLE and SLUICE_WEBHOOK_SECRET_ARN must be set")
    secret = boto3.client("secretsmanager").get_secret_value(SecretId=secret_arn).get("SecretString") or ""
    store = JobStore(boto3.resource("dynamodb").Table(table), ttl_days=int(os.environ.get("SLUICE_TTL_DAYS", "14")))
    return store, boto3.client("stepfunctions"), secret


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    store, sfn, secret = _clients()
    raw = event.get("body") or ""
    body = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode()

    def wake(token: str) -> None:
        try:
            sfn.send_task_success(taskToken=token, output="{}")
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in _STALE_TOKEN_ERRORS:
                raise

    verdict = handle_webhook(body=body, headers=event.get("headers") or {}, secret=secret, store=store, wake=wake)
    LOG.info(json.dumps({"webhook": verdict.outcome, "type": verdict.event_type, "status": verdict.status}))
    return {
        "statusCode": verdict.status,
        "headers": {"content-type": "application/json"},
        "body": json.dumps(verdict.body),
    }
