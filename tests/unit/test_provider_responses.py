"""Responses lines on the families that translate chat lines (issue 32, `sluice.providers.openai.responses`):
the request each family sends, the fields refused by name, and the answer given back as a response
that the family's finish and usage read as they read the same chat line's answer."""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from sluice.contract.model import ErrorCode, Request
from sluice.formats.lines import LineError, parse_line
from sluice.providers.anthropic.format import ANTHROPIC
from sluice.providers.bedrock.format import BEDROCK
from sluice.providers.format import COMPLETE, CUT_SHORT, RequestFormat, Unsupported

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
CLAUDE = "claude-3-5-haiku-latest"
HAIKU = "anthropic.claude-3-haiku-20240307-v1:0"
FAMILIES = [ANTHROPIC, BEDROCK]


def line(body: dict[str, Any]) -> bytes:
    return orjson.dumps({"custom_id": "r-1", "method": "POST", "url": RESPONSES, "body": body})


def test_a_responses_body_is_sent_to_messages_as_the_chat_body_asking_the_same() -> None:
    body = {
        "model": CLAUDE,
        "instructions": "Answer in one word.",
        "input": [
            {"role": "developer", "content": "Be kind."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Is it good?"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Yes."}]},
            {"role": "user", "content": "Sure?"},
        ],
        "max_output_tokens": 16,
        "temperature": 0.2,
        "top_p": 0.5,
        "user": "u-7",
        "metadata": {"team": "a"},
        "store": True,
        "text": {"format": {"type": "text"}},
    }
    assert ANTHROPIC.to_wire(RESPONSES, body) == {
        "model": CLAUDE,
        "max_tokens": 16,
        "system": "Answer in one word.\n\nBe kind.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Is it good?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]},
            {"role": "user", "content": "Sure?"},
        ],
        "temperature": 0.2,
        "top_p": 0.5,
        "metadata": {"user_id": "u-7"},
    }


def test_a_responses_body_is_sent_to_converse_as_the_chat_body_asking_the_same() -> None:
    body = {"model": HAIKU, "input": "Is it good?", "instructions": "One word.", "max_output_tokens": 4}
    wire = BEDROCK.to_wire(RESPONSES, body)
    assert wire == {
        "model": HAIKU,
        "system": [{"text": "One word."}],
        "messages": [{"role": "user", "content": [{"text": "Is it good?"}]}],
        "inferenceConfig": {"maxTokens": 4},
    }
    assert BEDROCK.route(RESPONSES, orjson.dumps(wire))[0] == "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"


def test_without_max_output_tokens_messages_gets_the_chat_lines_default_cap() -> None:
    chat = ANTHROPIC.to_wire(CHAT, {"model": CLAUDE, "messages": [{"role": "user", "content": "hi"}]})
    responses = ANTHROPIC.to_wire(RESPONSES, {"model": CLAUDE, "input": "hi"})
    assert responses["max_tokens"] == chat["max_tokens"] == 4096


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("previous_response_id", "resp_1", "previous_response_id"),
        ("conversation", "conv_1", "conversation"),
        ("background", True, "background"),
        ("tools", [{"type": "web_search"}], "tools"),
        ("reasoning", {"effort": "high"}, "reasoning"),
        ("include", ["reasoning.encrypted_content"], "include"),
        ("text", {"format": {"type": "json_object"}}, "text"),
        ("text", {"format": {"type": "json_schema", "name": "s", "schema": {}}}, "text"),
        ("stream", True, "stream"),
        ("stop", ["END"], "stop"),
        ("input", [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}], "input[0]"),
        ("input", [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}], "input[0]"),
        ("input", [{"type": "function_call_output", "call_id": "c", "output": "1"}], "input[0]"),
        ("input", [{"type": "item_reference", "id": "msg_1"}], "input[0]"),
        ("input", "", "input"),
    ],
)
def test_what_a_chat_translation_cannot_honour_is_refused_at_plan_by_name(
    family: RequestFormat, field: str, value: Any, named: str
) -> None:
    body = {"model": HAIKU, "input": "hi", field: value}
    with pytest.raises(Unsupported, match="^" + re.escape(named)):
        family.to_wire(RESPONSES, dict(body))
    parsed = parse_line(line(body), 3, request_format=family)
    assert isinstance(parsed, LineError) and parsed.code == ErrorCode.UNSUPPORTED_FIELD
    assert parsed.message.startswith(f"line 3: {named}")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_a_responses_line_is_planned_for_the_family(family: RequestFormat) -> None:
    parsed = parse_line(line({"model": HAIKU, "input": "hi", "max_output_tokens": 4}), 1, request_format=family)
    assert isinstance(parsed, Request) and parsed.path == RESPONSES


def messages_answer(stop_reason: str) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": CLAUDE,
        "content": [{"type": "text", "text": "positive"}],
        "stop_reason": stop_reason,
        "usage": {"input_tokens": 20, "cache_read_input_tokens": 5, "output_tokens": 3},
    }


def converse_answer(stop_reason: str) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": "positive"}]}},
        "stopReason": stop_reason,
        "usage": {"inputTokens": 25, "outputTokens": 3, "totalTokens": 28},
    }


def answered(family: RequestFormat, path: str, stop_reason: str) -> Any:
    if family is ANTHROPIC:
        return family.from_wire(path, messages_answer(stop_reason), 1700000000)
    sent = orjson.dumps(BEDROCK.to_wire(CHAT, {"model": HAIKU, "messages": [{"role": "user", "content": "hi"}]}))
    return family.from_wire(path, converse_answer(stop_reason), 1700000000, sent=sent, request_id="req-1")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_answer_is_a_response_whose_usage_is_the_chat_answers(family: RequestFormat) -> None:
    body = answered(family, RESPONSES, "end_turn")
    item_id = "msg_01" if family is ANTHROPIC else "req-1"
    assert body == {
        "id": item_id,
        "object": "response",
        "created_at": 1700000000,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "model": CLAUDE if family is ANTHROPIC else HAIKU,
        "output": [
            {
                "type": "message",
                "id": item_id,
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "positive", "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": 25,
            "input_tokens_details": {"cached_tokens": 5 if family is ANTHROPIC else 0},
            "output_tokens": 3,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 28,
        },
    }
    chat = answered(family, CHAT, "end_turn")
    assert family.usage(body) == family.usage(chat) and family.usage(body) is not None
    assert family.counted_tokens(body) == family.counted_tokens(chat)
    assert family.answered_model(body) == family.answered_model(chat)
    assert family.finish(body) == family.finish(chat) == COMPLETE


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize(
    ("anthropic_reason", "converse_reason", "reason", "finish"),
    [
        ("max_tokens", "max_tokens", "max_output_tokens", CUT_SHORT),
        ("refusal", "content_filtered", "content_filter", COMPLETE),
    ],
)
def test_an_answer_stopped_short_is_an_incomplete_response_saying_why(
    family: RequestFormat, anthropic_reason: str, converse_reason: str, reason: str, finish: str
) -> None:
    stop_reason = anthropic_reason if family is ANTHROPIC else converse_reason
    body = answered(family, RESPONSES, stop_reason)
    assert (body["status"], body["incomplete_details"]) == ("incomplete", {"reason": reason})
    assert body["output"][0]["status"] == "incomplete"
    # the same answer to a chat line finishes the same way
    assert family.finish(body) == family.finish(answered(family, CHAT, stop_reason)) == finish


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_an_error_body_comes_back_as_it_is(family: RequestFormat) -> None:
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert family.from_wire(RESPONSES, error, 1700000000) == error
