"""The simulator's structured output and its faults (`sluice_local.simulator.structured`): a request with a
JSON schema is answered with an object that matches it, and at set rates with answers off the schema,
not JSON, cut short or refused, in each dialect, the same for the same seed."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import fastjsonschema
import pytest
from sluice.contract import VALIDATION_CHECKS
from sluice.formats.validation import Validator
from sluice.providers import ANTHROPIC, OPENAI

from sluice_local.simulator import SimConfig, SimulatorServer
from sluice_local.simulator.structured import conforming
from tests.unit.helpers.simulator import wait_for

BASE = SimConfig(latency_s=0.0, seed=3)
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 3},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "score": {"type": "number", "exclusiveMaximum": 1},
        "sentiment": {"enum": ["positive", "negative"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": ["string", "null"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "sentiment", "tags", "address"],
    "additionalProperties": False,
}
ALL = Validator(frozenset(VALIDATION_CHECKS))


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(BASE) as running:
        yield running


@pytest.fixture
def sim(server: SimulatorServer) -> SimulatorServer:
    server.reset()
    server.configure(**dataclasses.asdict(BASE))
    return server


def request_body(path: str, prompt: str) -> dict[str, Any]:
    if path == CHAT:
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        return {"model": "m", "messages": [{"role": "user", "content": prompt}], "response_format": fmt}
    if path == RESPONSES:
        return {
            "model": "m",
            "input": prompt,
            "text": {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}},
        }
    messages = [{"role": "user", "content": prompt}]
    return {
        "model": "m",
        "max_tokens": 500,
        "messages": messages,
        "output_format": {"type": "json_schema", "schema": SCHEMA},
    }


def post(sim: SimulatorServer, path: str, body: dict[str, Any], custom_id: str) -> Any:
    family = ANTHROPIC if path == MESSAGES else OPENAI
    headers = {"Content-Type": "application/json", "x-sluice-custom-id": custom_id, **family.auth_headers("sk-t")}
    request = urllib.request.Request(family.url(sim.base_url, path), data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def checked(sim: SimulatorServer, path: str, custom_id: str) -> str | None:
    body = request_body(path, f"describe person {custom_id}")
    found = ALL.validate(path, body, post(sim, path, body, custom_id))
    return found.check if found is not None else None


def test_made_up_objects_match_their_schemas() -> None:
    schemas = [
        SCHEMA,
        {"type": "array", "items": {"type": "integer", "minimum": 5, "maximum": 6}, "minItems": 3, "maxItems": 3},
        {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
        {"type": "object", "properties": {"k": {"const": 7}}, "required": ["k"]},
    ]
    for schema in schemas:
        check = fastjsonschema.compile(schema)
        for seed in ("a", "b", "c", "d"):
            check(conforming(schema, seed))


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
def test_a_request_with_a_schema_is_answered_with_a_matching_object(sim: SimulatorServer, path: str) -> None:
    assert [checked(sim, path, f"line-{i}") for i in range(5)] == [None] * 5


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
@pytest.mark.parametrize(
    ("rate", "check"),
    [
        ("rate_off_schema", "schema"),
        ("rate_invalid_json", "json"),
        ("rate_truncated", "cut_short"),
        ("rate_refusal", "refusal"),
    ],
)
def test_each_output_fault_fails_its_check(sim: SimulatorServer, path: str, rate: str, check: str) -> None:
    sim.configure(**{rate: 1.0})
    assert checked(sim, path, "line-1") == check


def faults_of(sim: SimulatorServer, lines: int) -> list[str | None]:
    sim.reset()
    sim.configure(
        **{**dataclasses.asdict(BASE), "rate_off_schema": 0.1, "rate_invalid_json": 0.05, "rate_truncated": 0.05}
    )
    return [checked(sim, CHAT, f"line-{i}") for i in range(lines)]


@pytest.mark.slow
def test_output_faults_come_at_their_rates_the_same_for_the_same_seed(sim: SimulatorServer) -> None:
    first = faults_of(sim, 400)
    counts = Counter(first)
    assert 20 <= counts["schema"] <= 60 and 8 <= counts["json"] <= 35 and 8 <= counts["cut_short"] <= 35
    assert faults_of(sim, 400) == first


def test_a_request_sent_again_may_be_answered_well(sim: SimulatorServer) -> None:
    sim.configure(rate_off_schema=0.5)
    spoiled = [i for i in range(40) if checked(sim, CHAT, f"line-{i}") is not None]
    assert spoiled
    assert any(checked(sim, CHAT, f"line-{i}") is None for i in spoiled)


def test_a_batch_row_gets_its_output_fault_too(sim: SimulatorServer) -> None:
    from openai import OpenAI

    sim.configure(rate_off_schema=1.0, batch_phase_s=0.05)
    client = OpenAI(base_url=sim.url + "/v1", api_key="sk-t")
    body = request_body(CHAT, "describe one person")
    line = {"custom_id": "row-1", "method": "POST", "url": CHAT, "body": body}
    uploaded = client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_for(lambda: (b := client.batches.retrieve(batch.id)).status == "completed" and b)
    assert batch.output_file_id is not None
    row = json.loads(client.files.content(batch.output_file_id).read())
    found = ALL.validate(CHAT, body, row["response"]["body"])
    assert found is not None and found.check == "schema"
