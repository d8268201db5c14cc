"""The simulator's Gemini dialect (`sluice_local.simulator.gemini`): generateContent answers, errors, rate
limits and flex as Google's REST API gives them."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from sluice_local.simulator import SimConfig, SimulatorServer
from tests.unit.gemini_wire import MODEL, RETRY_INFO, ask, call, generate, simulator_fixtures

# flex's bad days off, so that only the tests of them meet them
gemini_server, sim = simulator_fixtures(SimConfig(latency_s=0.0, seed=7, flex_unavailable_rate=0.0))


def test_generate_content_answers_a_generate_content_response(sim: SimulatorServer) -> None:
    status, headers, answer = generate(
        sim, ask("positive or negative: I loved it", systemInstruction={"parts": [{"text": "One word."}]})
    )
    assert status == 200
    candidate = answer["candidates"][0]
    assert candidate["content"] == {"parts": [{"text": "positive"}], "role": "model"}
    assert candidate["finishReason"] == "STOP"
    usage = answer["usageMetadata"]
    assert usage["promptTokenCount"] > 0 and usage["candidatesTokenCount"] == 1
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["candidatesTokenCount"]
    assert answer["modelVersion"] == MODEL and answer["responseId"]
    assert not any(name.startswith(("x-ratelimit", "retry-after")) for name in headers)
    [entry] = sim.log
    assert entry["status"] == 200 and entry["service_tier"] == "standard"


def test_the_system_instruction_is_part_of_the_prompt(sim: SimulatorServer) -> None:
    _, _, bare = generate(sim, ask("Write a haiku."))
    _, _, told = generate(sim, ask("Write a haiku.", systemInstruction={"parts": [{"text": "You are a poet."}]}))
    assert told["usageMetadata"]["promptTokenCount"] > bare["usageMetadata"]["promptTokenCount"]
    assert told["candidates"][0]["content"] != bare["candidates"][0]["content"]


def test_snake_case_fields_are_read_as_proto3_json_allows(sim: SimulatorServer) -> None:
    status, _, answer = generate(sim, ask("Write a long story.", generation_config={"max_output_tokens": 1}))
    assert status == 200
    assert answer["candidates"][0]["finishReason"] == "MAX_TOKENS"


def test_a_response_schema_is_answered_with_json_that_matches_it(sim: SimulatorServer) -> None:
    schema = {
        "type": "OBJECT",
        "properties": {"label": {"type": "STRING", "enum": ["spam", "ham"]}, "score": {"type": "INTEGER"}},
        "required": ["label", "score"],
    }
    config = {"responseMimeType": "application/json", "responseSchema": schema}
    _, _, answer = generate(sim, ask("Classify: buy now", generationConfig=config))
    said = json.loads(answer["candidates"][0]["content"]["parts"][0]["text"])
    assert said["label"] in ("spam", "ham") and isinstance(said["score"], int)
    json_schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    config = {"responseMimeType": "application/json", "responseJsonSchema": json_schema}
    _, _, answer = generate(sim, ask("Is it fine?", generationConfig=config))
    assert isinstance(json.loads(answer["candidates"][0]["content"]["parts"][0]["text"])["ok"], bool)


def test_an_off_schema_fault_breaks_the_schema_the_request_gave(sim: SimulatorServer) -> None:
    sim.configure(rate_off_schema=1.0)
    schema = {"type": "OBJECT", "properties": {"label": {"type": "STRING"}}, "required": ["label"]}
    config = {"responseMimeType": "application/json", "responseSchema": schema}
    _, _, answer = generate(sim, ask("Classify: buy now", generationConfig=config))
    assert "label" not in json.loads(answer["candidates"][0]["content"]["parts"][0]["text"])


def test_a_refusal_fault_is_a_candidate_stopped_for_safety(sim: SimulatorServer) -> None:
    sim.configure(rate_refusal=1.0)
    _, _, answer = generate(sim, ask("Hello"))
    candidate = answer["candidates"][0]
    assert candidate["finishReason"] == "SAFETY" and "content" not in candidate


def test_inline_images_count_as_image_tokens(sim: SimulatorServer) -> None:
    image = {"inlineData": {"mimeType": "image/png", "data": base64.b64encode(b"\x89PNG fake").decode()}}
    body = {"contents": [{"role": "user", "parts": [{"text": "What is this?"}, image]}]}
    status, _, answer = generate(sim, body)
    assert status == 200
    modalities = {d["modality"]: d["tokenCount"] for d in answer["usageMetadata"]["promptTokensDetails"]}
    assert modalities["IMAGE"] == 258
    image["inlineData"]["data"] = "not base64!"
    status, _, answer = generate(sim, body)
    assert status == 400 and answer["error"]["status"] == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, 'Unknown name "messages"'),
        ({"contents": []}, "contents is not specified"),
        ({"contents": [{"role": "assistant", "parts": [{"text": "hi"}]}]}, "valid role"),
        (ask("hi", generationConfig={"max_tokens": 5}), 'Unknown name "generation_config.max_tokens"'),
        (ask("hi", generationConfig={"temperature": 3}), "temperature"),
        (ask("hi", generationConfig={"responseSchema": {"type": "OBJECT"}}), "response_mime_type"),
        (ask("hi", systemInstruction="be brief"), "system_instruction"),
        (ask("hi", serviceTier="cheapest"), "service_tier"),
    ],
)
def test_a_request_gemini_refuses_is_a_400_invalid_argument(
    sim: SimulatorServer, body: dict[str, Any], says: str
) -> None:
    status, _, answer = generate(sim, body)
    assert status == 400
    assert answer["error"]["code"] == 400 and answer["error"]["status"] == "INVALID_ARGUMENT"
    assert says in answer["error"]["message"]


def test_an_unknown_model_is_a_404_not_found(sim: SimulatorServer) -> None:
    status, _, answer = generate(sim, ask("hi"), model="gpt-4o-mini")
    assert status == 404 and answer["error"]["status"] == "NOT_FOUND"
    status, _, answer = call(sim, f"/v1beta/models/{MODEL}:streamSideways", ask("hi"))
    assert status == 404 and answer["error"]["status"] == "NOT_FOUND"


def test_a_missing_key_is_403_and_a_wrong_one_400_api_key_invalid(sim: SimulatorServer) -> None:
    status, _, answer = generate(sim, ask("hi"), key=None)
    assert status == 403 and answer["error"]["status"] == "PERMISSION_DENIED"
    sim.configure(api_key="AIza-right")
    status, _, answer = generate(sim, ask("hi"), key="AIza-wrong")
    assert status == 400 and answer["error"]["details"][0]["reason"] == "API_KEY_INVALID"
    assert generate(sim, ask("hi"), key="AIza-right")[0] == 200
    assert call(sim, f"/v1beta/models/{MODEL}:generateContent?key=AIza-right", ask("hi"), key=None)[0] == 200


def test_an_injected_429_is_resource_exhausted_with_its_retry_delay(sim: SimulatorServer) -> None:
    sim.configure(rate_429=1.0, retry_after_s=3.0)
    status, headers, answer = generate(sim, ask("hi"))
    assert status == 429 and "retry-after" not in headers
    error = answer["error"]
    assert error["status"] == "RESOURCE_EXHAUSTED"
    [retry] = [d for d in error["details"] if d["@type"] == RETRY_INFO]
    assert retry["retryDelay"] == "3s"


def test_the_rate_limit_is_resource_exhausted_naming_the_quota_and_the_wait(sim: SimulatorServer) -> None:
    sim.configure(quota_rpm=2)
    assert [generate(sim, ask(f"hi {i}"))[0] for i in range(2)] == [200, 200]
    status, _, answer = generate(sim, ask("one too many"))
    assert status == 429
    details = {d["@type"]: d for d in answer["error"]["details"]}
    assert details[RETRY_INFO]["retryDelay"].endswith("s")
    assert 20 <= float(details[RETRY_INFO]["retryDelay"][:-1]) <= 30
    violation = details["type.googleapis.com/google.rpc.QuotaFailure"]["violations"][0]
    assert "requests" in violation["quotaMetric"]
    # another key has a quota of its own
    assert generate(sim, ask("hi"), key="AIza-other")[0] == 200


def test_the_congestion_fault_is_a_503_unavailable(sim: SimulatorServer) -> None:
    sim.configure(rate_queue_wait=1.0)
    status, _, answer = generate(sim, ask("hi"))
    assert status == 503 and answer["error"]["status"] == "UNAVAILABLE"
    sim.configure(rate_queue_wait=0.0, rate_500=1.0)
    status, _, answer = generate(sim, ask("hi"))
    assert status == 500 and answer["error"]["status"] == "INTERNAL"


def test_flex_is_served_slower_and_said_in_the_usage(sim: SimulatorServer) -> None:
    sim.configure(latency_s=0.05, flex_slowdown=5.0)
    started = time.monotonic()
    status, _, answer = generate(sim, ask("hi", serviceTier="flex"))
    assert time.monotonic() - started >= 0.25
    assert status == 200 and answer["usageMetadata"]["serviceTier"] == "flex"
    assert generate(sim, ask("hi"))[2]["usageMetadata"]["serviceTier"] == "standard"
    assert [e["service_tier"] for e in sim.log] == ["flex", "standard"]


def test_flex_is_refused_for_a_model_without_it_and_sheds_load_on_a_busy_day(sim: SimulatorServer) -> None:
    sim.configure(flex_refusing_models="gemini-2.0-flash")
    status, _, answer = generate(sim, ask("hi", serviceTier="flex"), model="gemini-2.0-flash")
    assert status == 400 and answer["error"]["status"] == "INVALID_ARGUMENT"
    sim.configure(flex_unavailable_rate=1.0)
    status, _, answer = generate(sim, ask("hi", serviceTier="FLEX"))
    assert status == 429 and answer["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert generate(sim, ask("hi"))[0] == 200


def test_a_body_over_the_inline_limit_is_refused(sim: SimulatorServer) -> None:
    sim.configure(gemini_inline_limit=1000)
    status, _, answer = generate(sim, ask("word " * 400))
    assert status == 400 and "payload size exceeds the limit: 1000 bytes" in answer["error"]["message"]
    assert generate(sim, ask("short"))[0] == 200


def test_count_tokens_counts_the_prompt(sim: SimulatorServer) -> None:
    status, _, answer = call(sim, f"/v1beta/models/{MODEL}:countTokens", ask("one two three four five"))
    assert status == 200 and answer == {"totalTokens": 6}


def test_the_model_list_answers_a_key_check(sim: SimulatorServer) -> None:
    for version in ("v1beta", "v1"):
        status, _, answer = call(sim, f"/{version}/models", method="GET")
        assert status == 200 and f"models/{MODEL}" in [m["name"] for m in answer["models"]]
    assert call(sim, "/v1beta/models", method="GET", key=None)[0] == 403
    status, _, model = call(sim, f"/v1beta/models/{MODEL}", method="GET")
    assert status == 200 and "generateContent" in model["supportedGenerationMethods"]
    assert call(sim, "/v1beta/models/gpt-4o", method="GET")[0] == 404
    # without Google's key, /v1/models is OpenAI's list
    status, _, openai = call(sim, "/v1/models", method="GET", key=None, headers={"Authorization": "Bearer sk-x"})
    assert status == 200 and openai["object"] == "list"
