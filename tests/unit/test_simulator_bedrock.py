"""The simulator's Bedrock dialect (`sluice_local.simulator.bedrock`): Converse and InvokeModel answers,
signed requests only, and errors as Bedrock writes them, read back by Sluice's Bedrock format."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.credentials import Credentials
from sluice.contract import VALIDATION_CHECKS
from sluice.core.retry import RetryPolicy
from sluice.formats.validation import Validator
from sluice.providers import BEDROCK, Signer
from sluice.providers.bedrock import auth
from sluice.send.classify import RETRY, classify

from sluice_local.simulator import SimConfig, SimulatorServer

BASE = SimConfig(latency_s=0.0, seed=7)
MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"


class Session:
    region_name = "us-east-1"

    def __init__(self, access_key: str = "AKIDSIM") -> None:
        self.access_key = access_key

    def get_credentials(self) -> Credentials:
        return Credentials(self.access_key, "secret")


SIGN = auth.signer(Session(), "us-east-1")


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(BASE) as running:
        yield running


@pytest.fixture
def sim(server: SimulatorServer) -> SimulatorServer:
    server.reset()
    server.configure(**dataclasses.asdict(BASE))
    return server


def post(
    sim: SimulatorServer, path: str, line_body: dict[str, Any], *, signed: bool = True, sign: Signer = SIGN
) -> tuple[int, dict[str, str], Any]:
    """A line's body sent as Sluice's engine sends it: kept by `to_wire`, routed, signed."""
    kept = json.dumps(BEDROCK.to_wire(path, line_body)).encode()
    routed, body = BEDROCK.route(path, kept)
    url = BEDROCK.url(sim.url, routed)
    headers = {"Content-Type": "application/json"}
    if signed:
        headers = sign("POST", url, headers, body)
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status, head, raw = answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        status, head, raw = err.code, dict(err.headers), err.read()
    return status, head, json.loads(raw) if raw else None


def chat(text: str = "Reply with one word, positive or negative:\n\nI loved it", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def test_converse_answers_a_chat_line_which_comes_back_as_a_chat_completion(sim: SimulatorServer) -> None:
    status, headers, answer = post(sim, CHAT, chat())
    assert status == 200
    assert answer["output"]["message"]["content"] == [{"text": "positive"}]
    assert answer["stopReason"] == "end_turn"
    request_id = BEDROCK.request_id(headers, answer)
    assert request_id is not None and request_id == headers["x-amzn-RequestId"]
    assert not [h for h in headers if h.lower().startswith(("x-ratelimit", "anthropic-ratelimit"))]
    body = BEDROCK.from_wire(CHAT, answer, 0, sent=json.dumps({"model": MODEL}).encode(), request_id=request_id)
    assert body["choices"][0]["message"]["content"] == "positive" and body["model"] == MODEL
    assert [e["path"] for e in sim.log] == ["/model/anthropic.claude-3-haiku-20240307-v1:0/converse"]


def test_a_cap_too_small_stops_at_max_tokens(sim: SimulatorServer) -> None:
    _, _, answer = post(sim, CHAT, chat("Write a long story.", max_tokens=1))
    assert answer["stopReason"] == "max_tokens"


def test_invoke_model_answers_a_messages_body_natively(sim: SimulatorServer) -> None:
    native = {
        "model": MODEL,
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "positive or negative: awful"}],
    }
    status, _, answer = post(sim, MESSAGES, native)
    assert status == 200
    assert answer["type"] == "message" and answer["id"].startswith("msg_bdrk_")
    assert answer["content"] == [{"type": "text", "text": "negative"}]


def test_an_unsigned_request_is_refused(sim: SimulatorServer) -> None:
    status, headers, answer = post(sim, CHAT, chat(), signed=False)
    assert status == 403
    assert headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
    assert "Missing Authentication Token" in answer["message"]


POLICY = RetryPolicy(max_attempts=3)


@pytest.mark.parametrize(
    ("changes", "status", "error_type"),
    [
        ({"rate_429": 1.0}, 429, "ThrottlingException"),
        ({"rate_queue_wait": 1.0}, 503, "ServiceUnavailableException"),
        ({"rate_500": 1.0}, 500, "InternalServerException"),
    ],
)
def test_faults_are_bedrocks_errors_which_sluice_retries(
    sim: SimulatorServer, changes: dict[str, float], status: int, error_type: str
) -> None:
    sim.configure(**changes)
    got, headers, answer = post(sim, CHAT, chat())
    assert (got, headers["x-amzn-ErrorType"]) == (status, error_type)
    assert set(answer) == {"message"} and "retry-after" not in {h.lower() for h in headers}
    verdict = classify(
        got,
        headers,
        json.dumps(answer).encode(),
        None,
        attempt=1,
        policy=POLICY,
        request_format=BEDROCK,
        now=0.0,
        rand=lambda: 0.5,
    )
    assert verdict.kind == RETRY
    assert verdict.throttled == (error_type != "InternalServerException")


def test_the_quota_throttles_the_region_whoever_signs(sim: SimulatorServer) -> None:
    sim.configure(quota_rpm=2)
    other = auth.signer(Session("AKIDOTHER"), "us-east-1")
    assert [post(sim, CHAT, chat(), sign=s)[0] for s in (SIGN, other, SIGN)] == [200, 200, 429]


def test_a_body_that_names_its_model_is_refused_as_bedrock_does(sim: SimulatorServer) -> None:
    url = sim.url + "/model/m/converse"
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}]}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers=SIGN("POST", url, {}, body))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert refused.value.headers["x-amzn-ErrorType"] == "ValidationException"


@pytest.mark.parametrize(
    ("rate", "stop", "check"),
    [("rate_truncated", "max_tokens", "cut_short"), ("rate_refusal", "content_filtered", "refusal")],
)
def test_converse_answers_cut_short_or_refused_at_the_simulators_rates(
    sim: SimulatorServer, rate: str, stop: str, check: str
) -> None:
    sim.configure(**{rate: 1.0})
    _, _, answer = post(sim, CHAT, chat())
    assert answer["stopReason"] == stop
    body = BEDROCK.from_wire(CHAT, answer, 0, sent=json.dumps({"model": MODEL}).encode(), request_id="r")
    found = Validator(frozenset(VALIDATION_CHECKS)).validate(CHAT, chat(), body)
    assert found is not None and found.check == check
    assert sim.log[-1]["output_fault"] == rate.removeprefix("rate_")
