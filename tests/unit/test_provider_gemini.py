"""Gemini's request format (`sluice.providers.gemini`): chat and Responses lines translated to
generateContent and their answers back, lines it cannot take refused before anything is sent, its
error bodies (a 429's `retryDelay` as the retry floor), and its flex tier."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from sluice.contract.model import ErrorCode
from sluice.core.retry import RetryPolicy
from sluice.formats.lines import LineError, parse_line
from sluice.providers import CUT_SHORT, Unsupported, Usage, family, flex_models, modes
from sluice.providers.gemini import GEMINI
from sluice.send.classify import FAIL, RETRY, classify

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MODEL = "gemini-2.5-flash"
IMAGE = "data:image/png;base64,iVBORw0KGgo="


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Answer in one word."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": IMAGE}},
                ],
            },
            {"role": "assistant", "content": "A logo."},
            {"role": "user", "content": "Sure?"},
        ],
        **extra,
    }


def answer(text: str = "Yes.", reason: str = "STOP") -> dict[str, Any]:
    return {
        "candidates": [
            {
                "content": {"role": "model", "parts": [{"text": "thinking...", "thought": True}, {"text": text}]},
                "finishReason": reason,
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 40,
            "candidatesTokenCount": 3,
            "thoughtsTokenCount": 7,
            "totalTokenCount": 50,
            "cachedContentTokenCount": 8,
        },
        "modelVersion": "gemini-2.5-flash-001",
        "responseId": "resp-1",
    }


def test_gemini_is_a_family_with_direct_and_batch_and_a_flex_tier() -> None:
    assert family("gemini") is GEMINI
    assert modes("gemini") == {"direct", "batch"}
    assert MODEL in flex_models("gemini")


def test_a_chat_line_goes_as_generate_content_with_its_model_in_the_url() -> None:
    wire = GEMINI.to_wire(
        CHAT, chat(max_completion_tokens=20, temperature=0.2, top_p=0.9, stop="END", seed=3, presence_penalty=0.5)
    )
    assert wire["systemInstruction"] == {"parts": [{"text": "Answer in one word."}]}
    assert wire["contents"] == [
        {
            "role": "user",
            "parts": [{"text": "What is this?"}, {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}],
        },
        {"role": "model", "parts": [{"text": "A logo."}]},
        {"role": "user", "parts": [{"text": "Sure?"}]},
    ]
    assert wire["generationConfig"] == {
        "maxOutputTokens": 20,
        "temperature": 0.2,
        "topP": 0.9,
        "seed": 3,
        "presencePenalty": 0.5,
        "stopSequences": ["END"],
    }
    path, sent = GEMINI.route(CHAT, orjson.dumps(wire))
    assert path == f"/v1beta/models/{MODEL}:generateContent"
    assert "model" not in orjson.loads(sent or b"{}")
    assert GEMINI.url("https://generativelanguage.googleapis.com/", path) == (
        f"https://generativelanguage.googleapis.com/v1beta/models/{MODEL}:generateContent"
    )
    assert GEMINI.auth_headers("k") == {"x-goog-api-key": "k"}
    assert GEMINI.output_cap(wire, CHAT, default=99) == 20
    assert GEMINI.model(wire) == MODEL


def test_a_json_schema_goes_as_a_response_schema_gemini_accepts() -> None:
    schema = {
        "type": "object",
        "properties": {
            "sentiment": {"type": "string", "enum": ["positive", "negative"]},
            "score": {"type": ["number", "null"]},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
        },
        "required": ["sentiment", "score", "tags"],
        "additionalProperties": False,
        "$defs": {"tag": {"type": "string", "const": "x"}},
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "review", "strict": True, "schema": schema}}
    config = GEMINI.to_wire(CHAT, chat(response_format=fmt))["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseSchema"] == {
        "type": "OBJECT",
        "properties": {
            "sentiment": {"type": "STRING", "enum": ["positive", "negative"], "format": "enum"},
            "score": {"type": "NUMBER", "nullable": True},
            "tags": {"type": "ARRAY", "items": {"type": "STRING", "enum": ["x"], "format": "enum"}},
        },
        "propertyOrdering": ["sentiment", "score", "tags"],
        "required": ["sentiment", "score", "tags"],
    }
    assert GEMINI.to_wire(CHAT, chat(response_format={"type": "json_object"}))["generationConfig"] == {
        "responseMimeType": "application/json"
    }


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"n": 2}, "n:"),
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {"type": "string"}}}}}, ".not"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "integer", "enum": [1, 2]}},
                }
            },
            "enum",
        ),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_a_field_gemini_cannot_honour_is_refused_by_name(extra: dict[str, Any], named: str) -> None:
    with pytest.raises(Unsupported, match=named):
        GEMINI.to_wire(CHAT, chat(**extra))


def test_an_image_by_url_is_invalid_for_gemini_and_named_at_plan() -> None:
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": CHAT,
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}],
        },
    }
    parsed = parse_line(orjson.dumps(line), 1, request_format=GEMINI)
    assert isinstance(parsed, LineError)
    assert parsed.code == ErrorCode.UNSUPPORTED_FIELD
    assert "not a URL for it to fetch" in parsed.message


def test_a_line_without_a_model_is_refused() -> None:
    body = chat()
    del body["model"]
    with pytest.raises(Unsupported, match="model"):
        GEMINI.to_wire(CHAT, body)


def test_an_answer_comes_back_as_a_chat_completion_without_its_thinking() -> None:
    sent = orjson.dumps(GEMINI.to_wire(CHAT, chat()))
    body = GEMINI.from_wire(CHAT, answer(), 1_700_000_000, sent=sent, request_id=None)
    assert body["object"] == "chat.completion"
    assert body["id"] == "resp-1"
    assert body["model"] == "gemini-2.5-flash-001"
    assert body["choices"][0]["message"]["content"] == "Yes."
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 10,
        "total_tokens": 50,
        "prompt_tokens_details": {"cached_tokens": 8},
    }
    assert GEMINI.usage(body) == GEMINI.usage(answer()) == Usage(40, 10)
    assert GEMINI.request_id({}, answer()) == "resp-1"
    assert "service_tier" not in body


def test_an_answer_cut_at_its_cap_or_blocked_says_so() -> None:
    cut = GEMINI.from_wire(CHAT, answer(reason="MAX_TOKENS"), 0)
    assert cut["choices"][0]["finish_reason"] == "length"
    assert GEMINI.finish(cut) == GEMINI.finish(answer(reason="MAX_TOKENS")) == CUT_SHORT
    blocked = GEMINI.from_wire(CHAT, {"promptFeedback": {"blockReason": "SAFETY"}}, 0)
    assert blocked["choices"][0]["finish_reason"] == "content_filter"


def test_a_responses_line_goes_as_the_chat_it_asks_and_comes_back_a_response() -> None:
    body = {"model": MODEL, "instructions": "Be terse.", "input": "Hello", "max_output_tokens": 16}
    wire = GEMINI.to_wire(RESPONSES, body)
    assert wire["systemInstruction"] == {"parts": [{"text": "Be terse."}]}
    assert wire["contents"] == [{"role": "user", "parts": [{"text": "Hello"}]}]
    assert wire["generationConfig"] == {"maxOutputTokens": 16}
    response = GEMINI.from_wire(RESPONSES, answer(reason="MAX_TOKENS"), 5, sent=orjson.dumps(wire))
    assert response["object"] == "response"
    assert response["status"] == "incomplete"
    assert response["output"][0]["content"][0]["text"] == "Yes."
    assert response["usage"]["input_tokens"] == 40
    assert GEMINI.finish(response) == CUT_SHORT


def verdict(status: int, body: Any, attempt: int = 1) -> Any:
    return classify(
        status,
        {},
        orjson.dumps(body),
        None,
        attempt=attempt,
        policy=RetryPolicy(max_attempts=5, base_delay_s=0.5, max_delay_s=2.0),
        request_format=GEMINI,
        now=0.0,
        rand=lambda: 0.0,
    )


def test_a_resource_exhausted_429_waits_its_retry_delay() -> None:
    body = {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota. Please retry in 37.2s.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": []},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"},
            ],
        }
    }
    said = GEMINI.error(body)
    assert (said.code, said.retry_after_s) == ("RESOURCE_EXHAUSTED", 37.0)
    found = verdict(429, body)
    assert found.kind == RETRY
    assert found.throttled
    assert found.delay_s == 37.0
    # a 429 without RetryInfo backs off as any other
    assert verdict(429, {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "slow"}}).delay_s == 0.0


def test_an_invalid_argument_400_is_the_lines_error_and_not_retried() -> None:
    body = {"error": {"code": 400, "message": "Invalid JSON payload received.", "status": "INVALID_ARGUMENT"}}
    found = verdict(400, body)
    assert found.kind == FAIL
    assert found.code == ErrorCode.PROVIDER_ERROR
    assert "Invalid JSON payload" in found.message
    assert "INVALID_ARGUMENT" in found.message


def test_flex_goes_in_the_body_and_its_answer_is_priced_as_batch() -> None:
    wire = GEMINI.to_wire(CHAT, chat())
    assert GEMINI.added_tier(CHAT, wire, "flex") == "flex"
    sent = GEMINI.tiered(orjson.dumps(wire), "flex")
    assert orjson.loads(sent)["service_tier"] == "FLEX"
    answered = GEMINI.from_wire(CHAT, answer(), 0, sent=orjson.dumps(wire), tier="flex")
    assert GEMINI.batch_priced(answered)
    assert not GEMINI.batch_priced(GEMINI.from_wire(CHAT, answer(), 0, sent=orjson.dumps(wire)))
    # a line that names its own tier keeps it, and is priced by it
    own = GEMINI.to_wire(CHAT, chat(service_tier="flex"))
    assert GEMINI.added_tier(CHAT, own, "flex") == ""
    assert GEMINI.batch_priced(GEMINI.from_wire(CHAT, answer(), 0, sent=orjson.dumps(own)))
    # an answer that names the tier that served it is priced by that
    served = answer()
    served["usageMetadata"]["serviceTier"] = "standard"
    assert not GEMINI.batch_priced(GEMINI.from_wire(CHAT, served, 0, sent=orjson.dumps(own), tier="flex"))
    served["usageMetadata"]["serviceTier"] = "flex"
    assert GEMINI.batch_priced(GEMINI.from_wire(CHAT, served, 0, sent=orjson.dumps(wire)))


def test_flex_without_capacity_falls_back_and_a_model_without_flex_refuses_it() -> None:
    busy = {"error": {"code": 503, "message": "The flex tier has no capacity now.", "status": "UNAVAILABLE"}}
    assert GEMINI.tier_unavailable(503, busy)
    assert not GEMINI.tier_unavailable(429, {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}})
    flex_busy = {
        "error": {"code": 429, "message": "flex processing has no capacity now", "status": "RESOURCE_EXHAUSTED"}
    }
    assert GEMINI.tier_unavailable(429, flex_busy)
    refused = {
        "error": {
            "code": 400,
            "message": "service_tier FLEX is not supported for this model",
            "status": "INVALID_ARGUMENT",
        }
    }
    assert GEMINI.tier_refused(400, refused)
    assert not GEMINI.tier_refused(400, {"error": {"code": 400, "message": "bad schema", "status": "INVALID_ARGUMENT"}})


def test_validation_reads_the_kept_body_and_a_repair_adds_gemini_turns() -> None:
    from sluice.formats.validation import Validator
    from sluice.providers import answers
    from sluice.send.output_check import OutputCheck

    from tests.unit.helpers.output_check import BODY
    from tests.unit.helpers.output_check import answer as chat_answer

    wire = GEMINI.to_wire(CHAT, BODY)
    asked = answers.asked(CHAT, wire)
    assert asked.json
    assert asked.schema == {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    request = parse_line(
        orjson.dumps({"custom_id": "c-1", "url": CHAT, "method": "POST", "body": BODY}), 1, request_format=GEMINI
    )
    assert not isinstance(request, LineError) and request is not None
    check = OutputCheck(Validator(frozenset({"json", "schema"})), attempts=3, repair=True)
    again = check.judge(request, chat_answer('{"n": "x"}'), [])
    assert again is not None
    sent = orjson.loads(again.body or b"")
    assert "messages" not in sent
    assert sent["contents"][-2] == {"role": "model", "parts": [{"text": '{"n": "x"}'}]}
    assert sent["contents"][-1]["role"] == "user"
    assert "data.n must be integer" in sent["contents"][-1]["parts"][0]["text"]
    assert check.judge(request, chat_answer('{"n": 3}'), []) is None
