"""The simulator's Anthropic dialect (`sluice_local.simulator.messages`): Messages answers, errors and
rate-limit headers as Anthropic writes them, read back by Sluice's Anthropic format."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from sluice.providers import ANTHROPIC, ProviderError

from sluice_local.simulator import SimConfig, SimulatorServer

BASE = SimConfig(latency_s=0.0, seed=7)


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(BASE) as running:
        yield running


@pytest.fixture
def sim(server: SimulatorServer) -> SimulatorServer:
    server.reset()
    server.configure(**dataclasses.asdict(BASE))
    return server


def post(sim: SimulatorServer, body: dict[str, Any], *, key: str = "sk-ant-test") -> tuple[int, dict[str, str], Any]:
    headers = {"Content-Type": "application/json", **ANTHROPIC.auth_headers(key)}
    request = urllib.request.Request(
        ANTHROPIC.url(sim.url, "/v1/messages"), data=json.dumps(body).encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status, head, raw = answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        status, head, raw = err.code, dict(err.headers), err.read()
    return status, {k.lower(): v for k, v in head.items()}, json.loads(raw) if raw else None


def body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-3-5-haiku-latest",
        "max_tokens": 100,
        "system": "Reply with one word.",
        "messages": [{"role": "user", "content": "positive or negative: I loved it"}],
        **extra,
    }


def test_a_messages_request_is_answered_as_a_message(sim: SimulatorServer) -> None:
    status, headers, answer = post(sim, body())
    assert status == 200
    assert answer["type"] == "message"
    assert answer["id"].startswith("msg_")
    assert answer["content"][0]["type"] == "text"
    assert answer["stop_reason"] == "end_turn"
    assert ANTHROPIC.usage(answer) is not None
    assert ANTHROPIC.request_id(headers, answer) == headers["request-id"]
    assert "x-request-id" not in headers


def test_a_cap_too_small_stops_at_max_tokens(sim: SimulatorServer) -> None:
    _, _, answer = post(sim, body(max_tokens=1, messages=[{"role": "user", "content": "Write a long story."}]))
    assert answer["stop_reason"] == "max_tokens"


def test_a_request_without_max_tokens_is_refused_as_anthropic_does(sim: SimulatorServer) -> None:
    request = body()
    del request["max_tokens"]
    status, headers, answer = post(sim, request)
    assert status == 400
    assert answer["type"] == "error"
    assert answer["error"] == {"type": "invalid_request_error", "message": "max_tokens: Field required"}
    assert answer["request_id"] == headers["request-id"]


def test_the_key_is_read_from_x_api_key(sim: SimulatorServer) -> None:
    sim.configure(api_key="sk-ant-right")
    assert post(sim, body(), key="sk-ant-right")[0] == 200
    status, _, answer = post(sim, body(), key="sk-ant-wrong")
    assert status == 401
    assert ANTHROPIC.error(answer).code == "authentication_error"


def test_the_rate_limit_headers_are_anthropics(sim: SimulatorServer) -> None:
    sim.configure(quota_rpm=60, quota_tpm=60_000)
    _, headers, _ = post(sim, body())
    assert not any(name.startswith("x-ratelimit-") for name in headers)
    limits = ANTHROPIC.rate_limits(headers)
    assert (limits.requests_per_s, limits.tokens_per_s) == (1.0, 1000.0)
    assert ANTHROPIC.left(headers, "requests") == 59
    reset = ANTHROPIC.reset_s(headers, "requests", time.time())
    assert reset is not None and 0 < reset <= 1.1


def test_the_congestion_fault_is_a_529_overloaded_error(sim: SimulatorServer) -> None:
    sim.configure(rate_queue_wait=1.0, retry_after_s=2.0)
    status, headers, answer = post(sim, body())
    assert status == 529
    assert ANTHROPIC.error(answer) == ProviderError("overloaded_error", answer["error"]["message"])
    assert status in ANTHROPIC.throttle_statuses
    assert headers["retry-after"] == "2"


@pytest.mark.parametrize(
    ("rate", "status", "kind"), [("rate_429", 429, "rate_limit_error"), ("rate_500", 500, "api_error")]
)
def test_the_other_faults_are_anthropic_errors(sim: SimulatorServer, rate: str, status: int, kind: str) -> None:
    sim.configure(**{rate: 1.0})
    got, _, answer = post(sim, body())
    assert got == status
    assert answer["error"]["type"] == kind
