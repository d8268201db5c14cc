"""Talking to the simulator's Gemini dialect as Google's REST API is spoken, for its tests."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from sluice_local.simulator import SimConfig, Simulator, SimulatorServer

MODEL = "gemini-2.5-flash"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def simulator_fixtures(config: SimConfig) -> tuple[Any, Any]:
    """A module's simulator (fixture `gemini_server`) and, for each test, the same one reset to
    `config` (fixture `sim`)."""

    @pytest.fixture(scope="module", name="gemini_server")
    def server() -> Iterator[SimulatorServer]:
        started = SimulatorServer(config).start()
        yield started
        started.stop()

    def fresh(simulator: Simulator) -> None:
        simulator.reset()
        simulator.update_config(dataclasses.asdict(config))

    @pytest.fixture(name="sim")
    def reset(gemini_server: SimulatorServer) -> SimulatorServer:
        gemini_server.call(fresh)
        return gemini_server

    return server, reset


def call(
    sim: SimulatorServer,
    path: str,
    body: Any = None,
    *,
    key: str | None = "AIza-test",
    method: str = "POST",
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, dict[str, str], Any]:
    sent = {
        "Content-Type": "application/json",
        **({"x-goog-api-key": key} if key is not None else {}),
        **(headers or {}),
    }
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(sim.url + path, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status, head, read = answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        status, head, read = err.code, dict(err.headers), err.read()
    head = {k.lower(): v for k, v in head.items()}
    try:
        return status, head, json.loads(read) if read else None
    except ValueError:
        return status, head, read


def generate(
    sim: SimulatorServer, body: dict[str, Any], model: str = MODEL, **kw: Any
) -> tuple[int, dict[str, str], Any]:
    return call(sim, f"/v1beta/models/{model}:generateContent", body, **kw)


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": text}]}], **extra}
