"""The provider simulator: OpenAI SDK compatibility, faults, limits, logs, batches, webhooks."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from standardwebhooks.webhooks import Webhook

from sluice_local.simulator import (
    SimConfig,
    SimulatorServer,
    answer_for,
    body_key,
    count_tokens,
    decide_fault,
    sentiment,
)
from tests.unit.helpers.simulator import wait_for

BASE = SimConfig(latency_s=0.01, seed=7, batch_phase_s=0.05)
SENTIMENT = "Reply with one word, positive or negative:\n\n"
SECRET = "whsec_c2ltdWxhdG9yLXNlY3JldC1mb3ItdGVzdHM="


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(BASE) as running:
        yield running


@pytest.fixture
def sim(server: SimulatorServer) -> SimulatorServer:
    server.reset()
    server.configure(**dataclasses.asdict(BASE))
    return server


def client(sim: SimulatorServer, *, retries: int = 0, key: str = "sk-test") -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.base_url, api_key=key, max_retries=retries, timeout=10)


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body).encode() if body is not None else None
    merged = {"Authorization": "Bearer sk-test", "Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url, data=data, method=method, headers=merged)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status, head, raw = answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        status, head, raw = err.code, dict(err.headers), err.read()
    lowered = {k.lower(): v for k, v in head.items()}
    return status, lowered, json.loads(raw) if raw else None


def chat_body(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": text}], **extra}


# content


def test_sentiment_lexicon_and_ties() -> None:
    assert sentiment("A great, wonderful film. I loved it.") == "positive"
    assert sentiment("Boring and awful; a waste of time.") == "negative"
    assert sentiment("It was not good at all.") == "negative"
    assert sentiment("An ordinary film about a table.") == "positive"
    assert sentiment("good but bad") == "positive"


def test_answers_and_tokens_are_deterministic() -> None:
    assert answer_for(SENTIMENT + "Terrible plot, awful acting.") == "negative"
    other = answer_for("Tell me about rivers.")
    assert other == answer_for("Tell me about rivers.")
    assert other != answer_for("Tell me about stones.")
    assert other.startswith("Simulated reply:")
    assert count_tokens("one two three four five six seven eight nine ten") == 13
    assert count_tokens("") == 0


# OpenAI SDK compatibility


def test_chat_completion_parses_in_sdk(sim: SimulatorServer) -> None:
    api = client(sim)
    good = api.chat.completions.create(
        model="gpt-sim", messages=[{"role": "user", "content": SENTIMENT + "I loved it, a great and moving story."}]
    )
    bad = api.chat.completions.create(
        model="gpt-sim",
        messages=[
            {"role": "system", "content": "You classify reviews."},
            {"role": "user", "content": [{"type": "text", "text": SENTIMENT + "Dull, boring, the worst."}]},
        ],
    )
    assert good.id.startswith("chatcmpl-")
    assert good.object == "chat.completion"
    assert good.model == "gpt-sim"
    assert good.system_fingerprint == "fp_sluice_simulator"
    assert good.choices[0].message.content == "positive"
    assert good.choices[0].finish_reason == "stop"
    assert bad.choices[0].message.content == "negative"
    assert good.usage is not None
    assert good.usage.completion_tokens == 1
    assert good.usage.total_tokens == good.usage.prompt_tokens + good.usage.completion_tokens


def test_models_are_listed_as_an_openai_compatible_server_lists_them(sim: SimulatorServer) -> None:
    # `sluice run` asks for them before a job: a 404 there reads as a base URL with a wrong path
    models = [m.id for m in client(sim).models.list()]
    assert "gpt-4o-mini" in models


def test_chat_respects_max_tokens(sim: SimulatorServer) -> None:
    full = client(sim).chat.completions.create(model="m", messages=[{"role": "user", "content": "Describe a river."}])
    cut = client(sim).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Describe a river."}], max_completion_tokens=3
    )
    assert full.usage is not None and cut.usage is not None
    assert full.usage.completion_tokens > 3
    assert cut.usage.completion_tokens <= 3
    assert cut.choices[0].finish_reason == "length"
    assert (full.choices[0].message.content or "").startswith(cut.choices[0].message.content or "")


def test_completions_parse_in_sdk(sim: SimulatorServer) -> None:
    done = client(sim).completions.create(model="m", prompt=SENTIMENT + "Excellent value, works great.", max_tokens=50)
    assert done.object == "text_completion"
    assert done.choices[0].text == "positive"
    assert done.usage is not None and done.usage.completion_tokens == 1


@pytest.mark.slow
def test_responses_parse_in_sdk(sim: SimulatorServer) -> None:
    api = client(sim)
    answer = api.responses.create(
        model="m", input=[{"role": "user", "content": SENTIMENT + "Broken on arrival, useless."}], metadata={"k": "v"}
    )
    plain = api.responses.create(model="m", input="What is a sluice?")
    assert answer.id.startswith("resp_")
    assert answer.object == "response"
    assert answer.status == "completed"
    assert answer.output_text == "negative"
    assert answer.incomplete_details is None
    assert answer.metadata == {"k": "v"}
    assert answer.usage is not None
    assert answer.usage.total_tokens == answer.usage.input_tokens + answer.usage.output_tokens
    assert plain.output_text == answer_for("What is a sluice?")


def test_embeddings_are_deterministic_unit_vectors(sim: SimulatorServer) -> None:
    api = client(sim)
    first = api.embeddings.create(model="emb", input=["alpha", "beta"])
    again = api.embeddings.create(model="emb", input="alpha", dimensions=16)
    wide = api.embeddings.create(model="emb", input="alpha", dimensions=40)
    assert [d.index for d in first.data] == [0, 1]
    assert len(first.data[0].embedding) == 16
    assert first.data[0].embedding == again.data[0].embedding
    assert first.data[0].embedding != first.data[1].embedding
    assert math.isclose(sum(v * v for v in first.data[0].embedding), 1.0, rel_tol=1e-6)
    assert len(wide.data[0].embedding) == 40
    assert first.usage.prompt_tokens == 2


def test_background_response_lifecycle(sim: SimulatorServer) -> None:
    sim.configure(latency_s=0.5)
    api = client(sim)
    created = api.responses.create(model="m", input=SENTIMENT + "Lovely.", background=True)
    assert created.status == "queued"
    assert created.output == []
    time.sleep(0.2)
    assert api.responses.retrieve(created.id).status == "in_progress"
    done = wait_for(lambda: (r := api.responses.retrieve(created.id)).status == "completed" and r)
    assert done.output_text == "positive"
    assert done.usage is not None and done.usage.output_tokens == 1
    # terminal responses are not cancelled again
    assert api.responses.cancel(created.id).status == "completed"


def test_background_cancel(sim: SimulatorServer) -> None:
    sim.configure(latency_s=2.0)
    api = client(sim)
    created = api.responses.create(model="m", input="slow work", background=True)
    cancelled = api.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert api.responses.retrieve(created.id).status == "cancelled"


def test_background_incomplete_and_failed(sim: SimulatorServer) -> None:
    api = client(sim)
    sim.configure(incomplete_rate=1.0)
    started = api.responses.create(model="m", input="Describe a calm river in detail.", background=True)
    incomplete = wait_for(
        lambda: (r := api.responses.retrieve(started.id)).status != "queued" and r.status != "in_progress" and r
    )
    assert incomplete.status == "incomplete"
    assert incomplete.incomplete_details is not None
    assert incomplete.incomplete_details.reason == "max_output_tokens"
    assert incomplete.output_text
    assert answer_for("Describe a calm river in detail.").startswith(incomplete.output_text)
    sim.configure(incomplete_rate=0.0, failed_rate=1.0)
    started = api.responses.create(model="m", input="Another", background=True)
    failed = wait_for(lambda: (r := api.responses.retrieve(started.id)).status == "failed" and r)
    assert failed.error is not None and failed.error.code == "server_error"
    assert failed.output == []


def test_unknown_response_is_404(sim: SimulatorServer) -> None:
    with pytest.raises(openai.NotFoundError):
        client(sim).responses.retrieve("resp_missing")
    status, _, body = http("POST", f"{sim.base_url}/responses/resp_missing/cancel", {})
    assert status == 404
    assert body["error"]["type"] == "invalid_request_error"


# validation, auth, headers


def test_missing_model_is_openai_shaped_400(sim: SimulatorServer) -> None:
    status, headers, body = http("POST", f"{sim.base_url}/chat/completions", {"messages": []})
    assert status == 400
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == "model"
    assert headers["x-request-id"].startswith("req_")
    assert headers["server"] == "sluice-simulator"


def test_unknown_fields_are_ignored(sim: SimulatorServer) -> None:
    status, _, body = http("POST", f"{sim.base_url}/chat/completions", chat_body("hi", max_queue_wait_s=30, foo=1))
    assert status == 200
    assert body["choices"][0]["message"]["content"] == answer_for("hi")


def test_auth(sim: SimulatorServer) -> None:
    status, _, body = http("POST", f"{sim.base_url}/chat/completions", chat_body("hi"), {"Authorization": ""})
    assert status == 401
    assert body["error"]["code"] == "missing_api_key"
    sim.configure(api_key="sk-right")
    with pytest.raises(openai.AuthenticationError):
        client(sim, key="sk-wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert client(sim, key="sk-right").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert sim.config.api_key == "sk-right"
    status, _, public = http("GET", f"{sim.url}/sim/config")
    assert public["api_key"] == "***"


def test_unknown_route_is_openai_shaped(sim: SimulatorServer) -> None:
    status, _, body = http("POST", f"{sim.base_url}/nothing", {})
    assert status == 404
    assert body["error"]["code"] == "unknown_url"


# faults


def faults_by_key(sim: SimulatorServer) -> dict[str, list[Any]]:
    seen: dict[str, list[Any]] = {}
    for entry in sim.log:
        seen.setdefault(entry["custom_id"], []).append((entry["status"], entry["fault"]))
    return seen


@pytest.mark.slow
def test_faults_are_deterministic_and_independent_of_order(sim: SimulatorServer) -> None:
    sim.configure(rate_429=0.3, rate_500=0.2, retry_after_s=0.01)
    ids = [f"row-{i}" for i in range(40)]

    def send(order: list[str]) -> dict[str, list[Any]]:
        sim.reset()
        for custom_id in order:
            for _ in range(2):
                http(
                    "POST", f"{sim.base_url}/chat/completions", chat_body(custom_id), {"x-sluice-custom-id": custom_id}
                )
        return faults_by_key(sim)

    forward = send(ids)
    backward = send(list(reversed(ids)))
    assert forward == backward
    config = sim.config
    for custom_id in ids:
        expected = [decide_fault(config, custom_id, attempt) for attempt in range(2)]
        assert [fault for _, fault in forward[custom_id]] == expected
    statuses = {status for pairs in forward.values() for status, _ in pairs}
    assert statuses == {200, 429, 500}
    # some row fails first and succeeds when retried
    assert any(pairs[0][0] != 200 and pairs[1][0] == 200 for pairs in forward.values())


def test_faults_without_custom_id_use_the_body(sim: SimulatorServer) -> None:
    sim.configure(rate_500=0.5)
    body = chat_body("keyed by body")
    raw = json.dumps(body).encode()
    key = body_key("/v1/chat/completions", raw)
    expected = [500 if decide_fault(sim.config, key, n) == "500" else 200 for n in range(6)]
    got = []
    for _ in range(6):
        request = urllib.request.Request(
            f"{sim.base_url}/chat/completions",
            data=raw,
            method="POST",
            headers={"Authorization": "Bearer x", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                got.append(answer.status)
        except urllib.error.HTTPError as err:
            got.append(err.code)
    assert got == expected


def test_429_carries_retry_after_and_sdk_recovers(sim: SimulatorServer) -> None:
    sim.configure(rate_429=1.0, retry_after_s=2.5)
    status, headers, body = http("POST", f"{sim.base_url}/chat/completions", chat_body("x"))
    assert status == 429
    assert headers["retry-after"] == "3"
    assert headers["retry-after-ms"] == "2500"
    assert body["error"]["code"] == "rate_limit_exceeded"
    # find a key that is throttled once, then served: the SDK waits retry-after-ms and retries
    sim.configure(rate_429=0.5, retry_after_s=0.05)
    key = next(
        f"k{i}" for i in range(100) if decide_fault(sim.config, f"k{i}", 0) and not decide_fault(sim.config, f"k{i}", 1)
    )
    answer = client(sim, retries=2).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], extra_headers={"x-sluice-custom-id": key}
    )
    assert answer.choices[0].message.content
    assert [e["status"] for e in sim.log if e["custom_id"] == key] == [429, 200]


def test_drop_closes_the_connection(sim: SimulatorServer) -> None:
    sim.configure(rate_drop=1.0)
    with pytest.raises(openai.APIConnectionError):
        client(sim).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    entry = sim.log[-1]
    assert entry["fault"] == "drop"
    assert entry["status"] is None


def test_slow_and_queue_wait(sim: SimulatorServer) -> None:
    sim.configure(rate_slow=1.0, slow_s=0.3)
    started = time.monotonic()
    status, _, _ = http("POST", f"{sim.base_url}/chat/completions", chat_body("x"))
    assert status == 200
    assert time.monotonic() - started >= 0.3
    sim.configure(rate_slow=0.0, rate_queue_wait=1.0)
    status, headers, body = http("POST", f"{sim.base_url}/chat/completions", chat_body("x", max_queue_wait_s=0.01))
    assert status == 503
    assert body["error"]["code"] == "queue_wait_exceeded"
    assert "retry-after" in headers


@pytest.mark.slow
def test_flex_answers_slower_and_says_so(sim: SimulatorServer) -> None:
    sim.configure(latency_s=0.2, flex_slowdown=2.0, flex_unavailable_rate=0.0)
    started = time.monotonic()
    _, _, default = http("POST", f"{sim.base_url}/chat/completions", chat_body("x"))
    between = time.monotonic()
    _, _, flex = http("POST", f"{sim.base_url}/chat/completions", chat_body("x", service_tier="flex"))
    _, _, response = http("POST", f"{sim.base_url}/responses", {"model": "m", "input": "y", "service_tier": "flex"})
    ended = time.monotonic()
    assert default["service_tier"] == "default" and between - started < 0.4
    assert flex["service_tier"] == "flex" and response["service_tier"] == "flex" and ended - between >= 0.8
    assert [e["service_tier"] for e in sim.log] == ["default", "flex", "flex"]


@pytest.mark.slow
def test_flex_has_bad_days_by_default_and_refuses_the_models_without_it(sim: SimulatorServer) -> None:
    assert SimConfig().flex_unavailable_rate > 0
    sim.configure(flex_unavailable_rate=0.5)
    answers = [
        http(
            "POST",
            f"{sim.base_url}/chat/completions",
            chat_body("x", service_tier="flex"),
            {"x-sluice-custom-id": f"c-{n}"},
        )
        for n in range(40)
    ]
    unavailable = [body for status, _, body in answers if status == 429]
    assert 10 <= len(unavailable) <= 30 and all(status in (200, 429) for status, _, _ in answers)
    assert unavailable[0] == {
        "error": {
            "message": unavailable[0]["error"]["message"],
            "type": "rate_limit_error",
            "param": None,
            "code": "resource_unavailable",
        }
    }
    # only flex has such days
    plain = [http("POST", f"{sim.base_url}/chat/completions", chat_body(f"d-{n}"))[0] for n in range(20)]
    assert plain == [200] * 20

    status, _, body = http(
        "POST", f"{sim.base_url}/chat/completions", {**chat_body("x"), "model": "gpt-4o-mini", "service_tier": "flex"}
    )
    assert status == 400 and body["error"]["param"] == "service_tier"


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        SimConfig(flex_slowdown=0.5)
    with pytest.raises(ValueError):
        SimConfig(rate_429=0.7, rate_500=0.5)
    with pytest.raises(ValueError):
        BASE.updated({"nope": 1})
    with pytest.raises(ValueError):
        BASE.updated({"rate_429": "high"})
    assert BASE.updated({"rpm_limit": 10.0}).rpm_limit == 10


# limits


def test_rate_limit_headers_and_rpm(sim: SimulatorServer) -> None:
    _, headers, _ = http("POST", f"{sim.base_url}/chat/completions", chat_body("x"))
    for name in ("limit", "remaining", "reset"):
        for kind in ("requests", "tokens"):
            assert f"x-ratelimit-{name}-{kind}" in headers
    sim.configure(rpm_limit=3)
    remaining = []
    for _ in range(3):
        status, headers, _ = http("POST", f"{sim.base_url}/chat/completions", chat_body("x"))
        assert status == 200
        assert headers["x-ratelimit-limit-requests"] == "3"
        remaining.append(int(headers["x-ratelimit-remaining-requests"]))
    assert remaining == [2, 1, 0]
    status, headers, body = http("POST", f"{sim.base_url}/chat/completions", chat_body("x"))
    assert status == 429
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert int(headers["retry-after-ms"]) > 0
    assert sim.log[-1]["fault"] == "rate_limit"


def test_tpm_limit(sim: SimulatorServer) -> None:
    sim.configure(tpm_limit=40)
    text = " ".join(["word"] * 20)  # 26 prompt tokens plus the answer
    assert http("POST", f"{sim.base_url}/chat/completions", chat_body(text))[0] == 200
    status, headers, _ = http("POST", f"{sim.base_url}/chat/completions", chat_body(text))
    assert status == 429
    assert headers["x-ratelimit-limit-tokens"] == "40"


# admin


def test_log_and_admin_endpoints(sim: SimulatorServer) -> None:
    http("POST", f"{sim.base_url}/chat/completions", chat_body("x"), {"x-sluice-custom-id": "line-1"})
    http("POST", f"{sim.base_url}/responses", {"model": "m", "input": "y", "metadata": {"custom_id": "line-2"}})
    status, _, entries = http("GET", f"{sim.url}/sim/log")
    assert status == 200
    assert [(e["method"], e["path"], e["custom_id"], e["status"], e["fault"]) for e in entries] == [
        ("POST", "/v1/chat/completions", "line-1", 200, None),
        ("POST", "/v1/responses", "line-2", 200, None),
    ]
    assert all(isinstance(e["t"], float) for e in entries)
    assert http("DELETE", f"{sim.url}/sim/log")[0] == 200
    assert sim.log == []
    status, _, config = http("POST", f"{sim.url}/sim/config", {"latency_s": 0.02, "rate_500": 0.1})
    assert status == 200 and config["latency_s"] == 0.02 and config["rate_500"] == 0.1
    assert sim.config.rate_500 == 0.1
    assert http("POST", f"{sim.url}/sim/config", {"rate_500": 5})[0] == 400
    status, headers, health = http("GET", f"{sim.url}/sim/health")
    assert health["status"] == "ok" and health["simulator"] is True
    assert headers["server"] == "sluice-simulator"


@pytest.mark.slow
def test_many_concurrent_requests_overlap(sim: SimulatorServer) -> None:
    sim.configure(latency_s=0.3)
    results: list[int] = []

    def call() -> None:
        results.append(http("POST", f"{sim.base_url}/embeddings", {"model": "e", "input": "x"})[0])

    threads = [threading.Thread(target=call) for _ in range(100)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200] * 100
    # one at a time would take 30 s; overlapping, a few times the 0.3 s latency at most
    assert time.monotonic() - started < 10.0


# batches


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


@pytest.mark.slow
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
@pytest.mark.slow
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


@pytest.mark.slow
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
