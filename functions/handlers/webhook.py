from __future__ import annotations

import base64
import functools
import json
import threading
import time
from typing import Any

from botocore.exceptions import ClientError
from sluice.contract import WebhookSettings
from sluice.store import JobStore
from sluice.webhooks import handle_webhook

from .observability import instrumented, webhook_answered
from .runtime import session_for

# a token that timed out or was already used just means the shard woke some other way
_STALE_TOKEN_ERRORS = ("TaskTimedOut", "InvalidToken", "TaskDoesNotExist")
# The signing secret is set (and rotated) with put-secret-value after the stack exists; a warm
# container picks up the new value within this long instead of rejecting until it is recycled.
SECRET_MAX_AGE_S = 300.0

_secret_lock = threading.Lock()
_secret_cache: dict[str, tuple[float, str]] = {}
# API Gateway may deliver several webhooks at once to the local receiver's threads; botocore
# cannot create clients from one session in several threads at once.
_clients_lock = threading.Lock()


@functools.cache
def _clients(function_name: str) -> tuple[JobStore, Any, Any, str]:
    """The function's clients, from its own session (`handlers.runtime.session_for`)."""
    settings = WebhookSettings.from_env()
    session = session_for(function_name)
    store = JobStore(session.resource("dynamodb").Table(settings.table), ttl_days=settings.ttl_days)
    return store, session.client("stepfunctions"), session.client("secretsmanager"), settings.webhook_secret_arn


def _secret(secrets: Any, arn: str) -> str:
    """The signing secret, read at most every SECRET_MAX_AGE_S; never logged or passed on."""
    with _secret_lock:
        cached = _secret_cache.get(arn)
        if cached is not None and time.monotonic() - cached[0] < SECRET_MAX_AGE_S:
            return cached[1]
        value = secrets.get_secret_value(SecretId=arn).get("SecretString") or ""
        _secret_cache[arn] = (time.monotonic(), value)
        return str(value)


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    with _clients_lock:
        store, sfn, secrets, secret_arn = _clients(context.function_name)
    raw = event.get("body") or ""
    body = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode()

    def wake(token: str) -> None:
        try:
            sfn.send_task_success(taskToken=token, output="{}")
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in _STALE_TOKEN_ERRORS:
                raise

    verdict = handle_webhook(
        body=body,
        headers=event.get("headers") or {},
        secret=_secret(secrets, secret_arn),
        store=store,
        wake=wake,
    )
    webhook_answered(verdict.outcome, verdict.event_type, verdict.status)
    return {
        "statusCode": verdict.status,
        "headers": {"content-type": "application/json"},
        "body": json.dumps(verdict.body),
    }
