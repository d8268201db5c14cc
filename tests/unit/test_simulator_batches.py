"""The provider simulator's Batch API (completion, expiry, validation, cancel) and its signed webhooks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from standardwebhooks.webhooks import Webhook

from sluice_local.simulator import (
    SimulatorServer,
)
from tests.unit.sim_client import SECRET, SENTIMENT, client, wait_for


def batch_lines(count: int, *, bad: set[int] | None = None, url: str = "/v1/chat/completions") -> bytes:
    rows = []
    for i in range(count):
        body: dict[str, Any] = {"messages": [{"role": "user", "content": SENTIMENT + f"great film {i}"}]}
        if i not in (bad or set()):
            body["model"] = "m"
        rows.append(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url, "body": body}))
    return ("\n".join(rows) + "\n").encode()


def run_batch(api: openai.OpenAI, content: bytes, **create: Any) -> Any:
    uploaded = api.files.create(file=("in.jsonl", content), purpose="batch")
    batch = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", **create
    )
    assert batch.status == "validating"
    terminal = {"completed", "failed", "expired", "cancelled"}
    return wait_for(lambda: (b := api.batches.retrieve(batch.id)).status in terminal and b)


def read_jsonl(api: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(line) for line in api.files.content(file_id).text.splitlines()]


def test_batch_completes_with_shuffled_output_and_error_file(sim: SimulatorServer) -> None:
    api = client(sim)
    seen: list[str] = []
    finished = threading.Event()

    def watch() -> None:
        while not finished.is_set():
            listed = api.batches.list(limit=1).data
            if listed:
                seen.append(listed[0].status)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        done = run_batch(api, batch_lines(30, bad={4}), metadata={"job": "j1"})
    finally:
        finished.set()
        watcher.join()
    assert done.status == "completed"
    assert done.metadata == {"job": "j1"}
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (30, 29, 1)
    assert {"validating", "in_progress", "finalizing"} <= set(seen)
    output = read_jsonl(api, done.output_file_id)
    ids = [row["custom_id"] for row in output]
    assert sorted(ids) == sorted(f"c{i}" for i in range(30) if i != 4)
    assert ids != sorted(ids, key=lambda c: int(c[1:]))
    row = output[0]
    assert row["error"] is None
    assert row["response"]["status_code"] == 200
    assert row["response"]["body"]["choices"][0]["message"]["content"] == "positive"
    errors = read_jsonl(api, done.error_file_id)
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("c4", 400)]
    assert errors[0]["response"]["body"]["error"]["param"] == "model"
    creates = [e for e in sim.log if e["path"] == "/v1/batches" and e["method"] == "POST"]
    assert [e["batch_id"] for e in creates] == [done.id]


def test_batch_expires_with_partial_output(sim: SimulatorServer) -> None:
    sim.configure(batch_expire_fraction=1.0, batch_expire_done_fraction=0.5)
    api = client(sim)
    done = run_batch(api, batch_lines(40))
    assert done.status == "expired"
    finished = read_jsonl(api, done.output_file_id)
    leftover = read_jsonl(api, done.error_file_id)
    assert 0 < len(finished) < 40
    assert len(finished) + len(leftover) == 40
    assert {e["error"]["code"] for e in leftover} == {"batch_expired"}
    assert all(e["response"] is None for e in leftover)
    assert done.request_counts is not None and done.request_counts.completed == len(finished)


def test_batch_validation_failure(sim: SimulatorServer) -> None:
    api = client(sim)
    content = batch_lines(2) + b"not json\n" + batch_lines(1)  # the last line repeats custom_id c0
    done = run_batch(api, content)
    assert done.status == "failed"
    assert done.errors is not None and done.errors.data is not None
    assert [(e.line, e.code) for e in done.errors.data] == [(3, "invalid_json_line"), (4, "duplicate_custom_id")]
    assert done.output_file_id is None
    sim.configure(batch_validation_error=True)
    forced = run_batch(api, batch_lines(2))
    assert forced.status == "failed"
    assert forced.errors is not None and forced.errors.data
    assert forced.errors.data[0].code == "simulated_validation_error"


def test_batch_cancel_and_list(sim: SimulatorServer) -> None:
    sim.configure(batch_phase_s=0.5)
    api = client(sim)
    uploaded = api.files.create(file=("in.jsonl", batch_lines(5)), purpose="batch")
    first = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"n": "1"}
    )
    second = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"n": "2"}
    )
    listed = api.batches.list(limit=10).data
    assert [b.id for b in listed] == [second.id, first.id]
    assert api.batches.list(limit=1, after=second.id).data[0].metadata == {"n": "1"}
    cancelling = api.batches.cancel(first.id)
    assert cancelling.status == "cancelling"
    cancelled = wait_for(lambda: (b := api.batches.retrieve(first.id)).status == "cancelled" and b)
    assert cancelled.cancelled_at is not None
    # cancelled while validating: nothing ran, every row is in the error file
    leftover = read_jsonl(api, cancelled.error_file_id)
    assert {e["error"]["code"] for e in leftover} == {"batch_cancelled"}
    assert len(leftover) == 5
    with pytest.raises(openai.NotFoundError):
        api.batches.retrieve("batch_missing")


@pytest.mark.parametrize(("answers", "kept"), [("elapsed", (20, 57)), ("none", (0, 0))])
def test_a_batch_cancelled_late_hands_back_only_what_it_had_finished(
    sim: SimulatorServer, answers: str, kept: tuple[int, int]
) -> None:
    # cancelled while finalizing (past two of its three phases, about three quarters of its turnaround):
    # it had finished about that share of its rows, not all of them as its in-progress phase says
    sim.configure(batch_phase_s=0.4, batch_cancel_s=0.1, batch_cancel_answers=answers)
    api = client(sim)
    uploaded = api.files.create(file=("in.jsonl", batch_lines(60)), purpose="batch")
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    time.sleep(0.9)
    api.batches.cancel(batch.id)
    cancelled = wait_for(lambda: (b := api.batches.retrieve(batch.id)).status == "cancelled" and b)
    finished = read_jsonl(api, cancelled.output_file_id) if cancelled.output_file_id else []
    leftover = read_jsonl(api, cancelled.error_file_id) if cancelled.error_file_id else []
    assert kept[0] <= len(finished) <= kept[1] and len(finished) + len(leftover) == 60
    assert {e["error"]["code"] for e in leftover} == {"batch_cancelled"}


def test_with_batch_cancel_answers_none_an_expired_batch_hands_back_nothing(sim: SimulatorServer) -> None:
    sim.configure(batch_expire_fraction=1.0, batch_expire_done_fraction=0.5, batch_cancel_answers="none")
    api = client(sim)
    done = run_batch(api, batch_lines(20))
    assert done.status == "expired" and done.request_counts is not None and done.request_counts.completed == 0


def test_batch_rejects_unknown_file(sim: SimulatorServer) -> None:
    with pytest.raises(openai.BadRequestError):
        client(sim).batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")


# webhooks


class Receiver:
    """A webhook endpoint on 127.0.0.1 that records what it is sent."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], str]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                with outer.lock:
                    outer.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def events(self) -> list[tuple[dict[str, str], str]]:
        with self.lock:
            return list(self.received)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.httpd.shutdown()
    running.httpd.server_close()


def test_signed_webhooks_for_responses_and_batches(sim: SimulatorServer, receiver: Receiver) -> None:
    sim.configure(webhook_url=receiver.url, webhook_secret=SECRET)
    api = client(sim)
    created = api.responses.create(model="m", input="hook me", background=True)
    batch = run_batch(api, batch_lines(3))
    events = wait_for(lambda: len(receiver.events()) >= 2 and receiver.events())
    verifier = Webhook(SECRET)
    by_type = {}
    for headers, body in events:
        payload = verifier.verify(body, headers)
        sdk_event = api.webhooks.unwrap(body, headers, secret=SECRET)
        assert sdk_event.type == payload["type"]
        assert headers["webhook-id"] == payload["id"]
        by_type[payload["type"]] = payload
    assert by_type["response.completed"]["data"]["id"] == created.id
    assert by_type["batch.completed"]["data"]["id"] == batch.id
    assert by_type["response.completed"]["object"] == "event"
    tampered = dict(events[0][0], **{"webhook-signature": "v1,AAAA"})
    with pytest.raises(Exception, match="signature"):
        verifier.verify(events[0][1], tampered)


def test_webhook_faults(sim: SimulatorServer, receiver: Receiver) -> None:
    sim.configure(webhook_url=receiver.url, webhook_secret=SECRET, webhook_duplicate_rate=1.0)
    api = client(sim)
    created = api.responses.create(model="m", input="twice", background=True)
    events = wait_for(lambda: len(receiver.events()) >= 2 and receiver.events())
    assert {h["webhook-id"] for h, _ in events} == {events[0][0]["webhook-id"]}
    assert all(json.loads(body)["data"]["id"] == created.id for _, body in events)
    sim.configure(webhook_duplicate_rate=0.0, webhook_drop_rate=1.0)
    dropped = api.responses.create(model="m", input="never", background=True)
    record = wait_for(lambda: [w for w in sim.webhooks if w["data_id"] == dropped.id])
    assert record[0]["dropped"] is True
    time.sleep(0.1)
    assert len(receiver.events()) == 2
    sim.configure(webhook_drop_rate=0.0, webhook_delay_s=0.3)
    api.responses.create(model="m", input="later", background=True)
    time.sleep(0.15)
    assert len(receiver.events()) == 2
    wait_for(lambda: len(receiver.events()) == 3)
