"""Provider webhooks: verify, mark the item or batch settled, wake the shard, remember the id.

Webhooks only make jobs faster. Everything here is safe to lose, repeat or reorder: a shard
that never hears one reconciles by polling when its wait times out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from standardwebhooks.webhooks import Webhook

from sluice.contract import causes
from sluice.providers.bedrock.events import ended_job
from sluice.store.webhook_rows import Again

MAX_BODY_BYTES = 256 * 1024
RESPONSE_EVENTS = frozenset({"response.completed", "response.failed", "response.incomplete", "response.cancelled"})
BATCH_EVENTS = frozenset({"batch.completed", "batch.failed", "batch.expired", "batch.cancelled"})
REQUIRED_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


@dataclass(frozen=True)
class WebhookReply:
    """What to answer, and what happened, for logs and metrics (never the payload or secret)."""

    status: int
    outcome: str
    event_type: str | None = None

    @property
    def body(self) -> dict[str, Any]:
        # rejections say as little as possible; the reason goes to our logs, not the caller
        return {"ok": self.status < 300}


def handle_webhook(
    *,
    body: bytes,
    headers: Mapping[str, str],
    secret: str,
    store: Any,
    wake: Callable[[str], None],
) -> WebhookReply:
    if len(body) > MAX_BODY_BYTES:
        return WebhookReply(413, "rejected:too_large")
    lowered = {k.lower(): v for k, v in headers.items()}
    if any(not lowered.get(name) for name in REQUIRED_HEADERS):
        return WebhookReply(400, "rejected:missing_headers")
    try:
        Webhook(secret).verify(body, lowered, json_parse=False)
    except Exception:
        return WebhookReply(401, "rejected:signature")
    try:
        event = orjson.loads(body)
    except orjson.JSONDecodeError:
        return WebhookReply(400, "rejected:malformed")
    if not isinstance(event, dict) or not isinstance(event.get("data"), dict):
        return WebhookReply(400, "rejected:malformed")
    event_type = event.get("type")
    provider_id = event["data"].get("id")
    if event_type not in RESPONSE_EVENTS | BATCH_EVENTS or not isinstance(provider_id, str):
        return WebhookReply(400, "rejected:unknown_type", str(event_type))
    if event_type in RESPONSE_EVENTS:
        # A response's settle is conditional on its line's row, so it says itself whether the
        # delivery is a repeat: no row a webhook id, which was a write a line at the key's rate.
        token = store.settle_item(provider_id)
        if isinstance(token, Again):
            # a repeat delivery, not its line's webhook: counted apart, as a race is
            causes.instead(causes.REPEAT)
        if token:
            with causes.because(causes.WAKE_AGAIN if isinstance(token, Again) else causes.WAKE):
                wake(token)
        if isinstance(token, Again) and not token:
            return WebhookReply(200, "duplicate", event_type)
        return WebhookReply(200, "accepted:woke_shard" if token else "accepted", event_type)
    # a batch's webhook comes once a batch part, not once a line
    causes.instead(causes.BATCH_WEBHOOK)
    token = store.settle_batch(provider_id, event_type.removeprefix("batch."))
    if token is not None:
        with causes.because(causes.WAKE_AGAIN if isinstance(token, Again) else causes.WAKE):
            wake(token)
    # The id is remembered only once the work is done: a delivery that failed half-way (a
    # throttled write, a failed wake) is retried by the provider and done in full. The work
    # is idempotent, so a true repeat changes nothing and is only counted.
    if not store.remember_webhook(lowered["webhook-id"], time.time()):
        return WebhookReply(200, "duplicate", event_type)
    return WebhookReply(200, "accepted:woke_shard" if token else "accepted", event_type)


def handle_job_event(*, event: Mapping[str, Any], store: Any, wake: Callable[[str], None]) -> WebhookReply:
    """A provider's job-state event from EventBridge (Amazon Bedrock's batch inference): AWS
    delivers it, so there is no signature to check; it settles and wakes as a batch webhook does."""
    ended = ended_job(event)
    if ended is None:
        return WebhookReply(400, "rejected:unknown_type", str(event.get("detail-type")))
    job_id, state = ended
    causes.instead(causes.BATCH_WEBHOOK)
    token = store.settle_batch(job_id, state)
    if token is not None:
        with causes.because(causes.WAKE):
            wake(token)
    return WebhookReply(200, "accepted:woke_shard" if token else "accepted", f"batch.{state}")
