"""What the simulator's tests share: its settings for them, and how they call it (the OpenAI SDK,
plain HTTP) and wait on it. The server itself is conftest's `sim` fixture."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import openai

from sluice_local.simulator import SimConfig, SimulatorServer

BASE = SimConfig(latency_s=0.01, seed=7, batch_phase_s=0.05)
SENTIMENT = "Reply with one word, positive or negative:\n\n"
SECRET = "whsec_c2ltdWxhdG9yLXNlY3JldC1mb3ItdGVzdHM="


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


def wait_for(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


# content
