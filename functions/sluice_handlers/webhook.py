from __future__ import annotations

import base64
import functools
import json
import threading
from typing import Any

from aws_lambda_powertools.utilities.parameters import SecretsProvider
from botocore.exceptions import ClientError
from sluice.contract import WebhookSettings, causes
from sluice.runners.webhooks import handle_job_event, handle_webhook
from sluice.store.jobs import JobStore

from .observability import instrumented, webhook_answered
from .runtime import read_secret, session_for

# a token that timed out or was already used just means the shard woke some other way
_STALE_TOKEN_ERRORS = ("TaskTimedOut", "InvalidToken", "TaskDoesNotExist")
# API Gateway may deliver several webhooks at once to the local receiver's threads; botocore
# cannot create clients from one session in several threads at once.
_clients_lock = threading.Lock()


@functools.cache
def _clients(function_name: str) -> tuple[JobStore, Any, SecretsProvider, str]:
    """The function's clients, from its own session (`sluice_handlers.runtime.session_for`)."""
    settings = WebhookSettings.from_env()
    session = session_for(function_name)
    store = JobStore(session.resource("dynamodb").Table(settings.table), ttl_days=settings.ttl_days)
    secrets = SecretsProvider(boto3_client=session.client("secretsmanager"))
    return store, session.client("stepfunctions"), secrets, settings.webhook_secret_arn


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    with _clients_lock:
        store, sfn, secrets, secret_arn = _clients(context.function_name)
    raw = event.get("body") or ""
    body = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode()

    @causes.under(causes.WAKE, causes.WAKE_AGAIN)
    def wake(token: str) -> None:
        try:
            sfn.send_task_success(taskToken=token, output="{}")
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in _STALE_TOKEN_ERRORS:
                raise

    if "detail-type" in event:
        # EventBridge, not API Gateway: a provider's job-state event (Bedrock batch inference)
        reply = handle_job_event(event=event, store=store, wake=wake)
    else:
        reply = handle_webhook(
            body=body,
            headers=event.get("headers") or {},
            secret=read_secret(secrets, secret_arn),
            store=store,
            wake=wake,
        )
    webhook_answered(reply.outcome, reply.event_type, reply.status)
    return {
        "statusCode": reply.status,
        "headers": {"content-type": "application/json"},
        "body": json.dumps(reply.body),
    }
