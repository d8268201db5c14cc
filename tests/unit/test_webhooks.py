"""Webhook verification and state changes, against a moto DynamoDB table."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.runners.webhooks import MAX_BODY_BYTES, handle_webhook
from sluice.store.jobs import ItemState, JobStore

from sluice_local.cloud import LocalCloud
from tests.conftest import plan_figures

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"fedcba9876543210fedcba9876543210").decode()


def sign(body: bytes, *, secret: str = SECRET, msg_id: str = "msg_1", ts: int | None = None) -> dict[str, str]:
    """An independent Standard Webhooks signer: HMAC-SHA256 over id.timestamp.body."""
    ts = int(time.time()) if ts is None else ts
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }


def event(kind: str, provider_id: str) -> bytes:
    return orjson.dumps({"id": "evt_1", "object": "event", "created_at": 1, "type": kind, "data": {"id": provider_id}})


@pytest.fixture
def store() -> Iterator[JobStore]:
    with mock_aws():
        cloud = LocalCloud(provider_base_url="http://unused", api_key="k")
        cloud._create_resources()
        table = boto3.resource("dynamodb", region_name="us-east-1").Table(cloud.table_name)
        job_store = JobStore(table, ttl_days=1)
        job_store.record_plan("job", plan=plan_figures(2), shards=[(0, 2, 2)], mode="background")
        job_store.record_progress(
            "job",
            0,
            [ItemState(1, "a", "submitted", "resp_a"), ItemState(2, "b", "submitted", "resp_b")],
            done=0,
            failed=0,
            finished=False,
            run=1,
            waiting=2,
        )
        yield job_store


def snapshot(store: JobStore) -> list[dict[str, Any]]:
    return sorted(store._table.scan()["Items"], key=lambda r: (r["pk"], r["sk"]))


def call(store: JobStore, body: bytes, headers: dict[str, str], woken: list[str] | None = None):
    return handle_webhook(
        body=body, headers=headers, secret=SECRET, store=store, wake=(woken if woken is not None else []).append
    )


GOOD = event("response.completed", "resp_a")
FORGED = base64.b64encode(b"x" * 32).decode()


# headers are signed when the test runs: signed at collection, they would be stale (past the
# 5-minute tolerance) by the time a long suite reached them
@pytest.mark.parametrize(
    ("name", "body", "headers", "status"),
    [
        (
            "forged",
            GOOD,
            lambda: {**sign(GOOD), "webhook-signature": "v1," + base64.b64encode(b"x" * 32).decode()},
            401,
        ),
        ("replayed, old timestamp", GOOD, lambda: sign(GOOD, ts=int(time.time()) - 3600), 401),
        ("from the future", GOOD, lambda: sign(GOOD, ts=int(time.time()) + 3600), 401),
        ("tampered body", GOOD.replace(b"resp_a", b"resp_b"), lambda: sign(GOOD), 401),
        ("wrong secret", GOOD, lambda: sign(GOOD, secret=OTHER_SECRET), 401),
        ("missing signature", GOOD, lambda: {k: v for k, v in sign(GOOD).items() if k != "webhook-signature"}, 400),
        ("missing id", GOOD, lambda: {k: v for k, v in sign(GOOD).items() if k != "webhook-id"}, 400),
        ("garbage signature header", GOOD, lambda: {**sign(GOOD), "webhook-signature": "nonsense"}, 401),
        ("oversized", b"{" + b" " * MAX_BODY_BYTES + b"}", lambda: sign(b"{}"), 413),
        ("malformed json", b"{nope", lambda: sign(b"{nope"), 400),
        ("not an event", b"[1,2]", lambda: sign(b"[1,2]"), 400),
        ("unknown type", event("invoice.paid", "resp_a"), lambda: sign(event("invoice.paid", "resp_a")), 400),
    ],
)
def test_rejected_requests_change_nothing(
    store: JobStore, name: str, body: bytes, headers: Callable[[], dict[str, str]], status: int
) -> None:
    before = snapshot(store)
    verdict = call(store, body, headers())
    assert verdict.status == status, name
    assert verdict.body == {"ok": False}
    assert snapshot(store) == before


def test_accepted_webhook_settles_the_item_and_a_replay_is_a_no_op(store: JobStore) -> None:
    headers = sign(GOOD)
    assert call(store, GOOD, headers).outcome == "accepted"
    item = store.item("job", 0, 1)
    assert item is not None and item.status == "settled"
    after_first = snapshot(store)
    assert call(store, GOOD, headers).outcome == "duplicate"
    # the same event under a new webhook id (a provider retry) cannot settle twice either
    call(store, GOOD, sign(GOOD, msg_id="msg_2"))
    changed = [r for r in snapshot(store) if not r["pk"].startswith(("WEBHOOK#", "EARLY#"))]
    assert changed == [r for r in after_first if not r["pk"].startswith(("WEBHOOK#", "EARLY#"))]


def test_the_last_settled_item_wakes_the_armed_shard(store: JobStore) -> None:
    assert store.arm_shard("job", 0, "token-1") is False
    woken: list[str] = []
    call(store, GOOD, sign(GOOD), woken)
    assert woken == []
    second = event("response.incomplete", "resp_b")
    assert call(store, second, sign(second, msg_id="msg_b"), woken).outcome == "accepted:woke_shard"
    assert woken == ["token-1"]


def test_unknown_response_is_a_quiet_no_op(store: JobStore) -> None:
    body = event("response.completed", "resp_elsewhere")
    before = [r for r in snapshot(store) if not r["pk"].startswith(("WEBHOOK#", "EARLY#"))]
    assert call(store, body, sign(body)).status == 200
    assert [r for r in snapshot(store) if not r["pk"].startswith(("WEBHOOK#", "EARLY#"))] == before


def test_signature_from_the_openai_sdk_verifier_agrees() -> None:
    from openai import OpenAI

    client = OpenAI(api_key="unused", webhook_secret=SECRET)
    headers = sign(GOOD)
    client.webhooks.verify_signature(GOOD, headers)
    with pytest.raises(Exception):  # noqa: B017 - the SDK's own error type for a bad signature
        client.webhooks.verify_signature(GOOD + b" ", headers)


def test_a_webhook_that_beats_the_item_row_still_settles_it(store: JobStore) -> None:
    """A fast provider finishes before the submitter stores the id; the marker catches it up."""
    early = event("response.completed", "resp_c")
    assert call(store, early, sign(early, msg_id="msg_c")).status == 200
    item = ItemState(3, "c", "submitted", "resp_c")
    store.record_progress("job", 0, [item], done=0, failed=0, finished=False, run=2, waiting=1)
    assert store.settle_early("job", 0, [item]) == 1
    settled = store.item("job", 0, 3)
    assert settled is not None and settled.status == "settled"
    shard = store.shards("job")[0]
    assert shard.waiting == 2  # a and b still out; c counted off


def test_a_delivery_whose_wake_failed_is_retried_in_full_and_wakes_the_shard(store: JobStore) -> None:
    store.arm_shard("job", 0, "token-1")
    call(store, GOOD, sign(GOOD))
    last = event("response.completed", "resp_b")
    headers = sign(last, msg_id="msg_b")

    def unreachable(_token: str) -> None:
        raise RuntimeError("Step Functions throttled the wake")

    with pytest.raises(RuntimeError):
        handle_webhook(body=last, headers=headers, secret=SECRET, store=store, wake=unreachable)
    # the provider retries the same delivery; the item is settled already, the shard not woken
    woken: list[str] = []
    assert call(store, last, headers, woken).outcome == "accepted:woke_shard"
    assert woken == ["token-1"]


class FlakyStore:
    """The real store, but its first settle fails the way a throttled DynamoDB write does."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self.failures = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def settle_item(self, response_id: str) -> str | None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("ProvisionedThroughputExceededException")
        return self._store.settle_item(response_id)


def test_a_delivery_that_failed_before_settling_is_not_taken_for_a_duplicate(store: JobStore) -> None:
    flaky = FlakyStore(store)
    headers = sign(GOOD)
    with pytest.raises(RuntimeError):
        handle_webhook(body=GOOD, headers=headers, secret=SECRET, store=flaky, wake=print)
    assert handle_webhook(body=GOOD, headers=headers, secret=SECRET, store=flaky, wake=print).outcome == "accepted"
    item = store.item("job", 0, 1)
    assert item is not None and item.status == "settled"


def test_a_response_webhook_writes_the_line_and_the_shard_count_only(store: JobStore) -> None:
    """A webhook comes once a line: its own id row was a third write a line. The line's
    conditional settle tells a repeat instead, whatever id the provider gives the delivery."""
    before = {(r["pk"], r["sk"]) for r in snapshot(store)}
    assert call(store, GOOD, sign(GOOD)).outcome == "accepted"
    assert {(r["pk"], r["sk"]) for r in snapshot(store)} == before
    assert call(store, GOOD, sign(GOOD, msg_id="msg_again")).outcome == "duplicate"
    assert store.shards("job")[0].waiting == 1
