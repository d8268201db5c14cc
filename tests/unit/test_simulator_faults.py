"""The provider simulator's faults and limits: deterministic faults, 429s, drops, slow answers, flex,
its settings checked, RPM/TPM limits and their headers, the request log, concurrency."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from sluice_local.simulator import (
    SimConfig,
    SimulatorServer,
    body_key,
    decide_fault,
)
from tests.unit.sim_client import BASE, chat_body, client, http


def faults_by_key(sim: SimulatorServer) -> dict[str, list[Any]]:
    seen: dict[str, list[Any]] = {}
    for entry in sim.log:
        seen.setdefault(entry["custom_id"], []).append((entry["status"], entry["fault"]))
    return seen


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
