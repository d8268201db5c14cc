"""Anthropic's request format (`sluice.providers.anthropic`): the Messages API's headers, answers and
errors, and a chat-completions line translated to a Messages request and its answer back."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from sluice.contract import Settings
from sluice.contract.model import ErrorCode, Request
from sluice.formats.lines import LineError, parse_line
from sluice.providers import ANTHROPIC, COMPLETE, CUT_SHORT, ProviderError, RateLimits, Unsupported, Usage, apis, family
from sluice.providers.anthropic.batch import AnthropicBatchApi
from sluice.providers.anthropic.format import parse_reset
from sluice.providers.anthropic.translate import DEFAULT_MAX_TOKENS

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
NOW = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


def answer(stop_reason: str = "end_turn", **usage: int) -> dict[str, Any]:
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-3-5-haiku-latest",
        "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 5, **usage},
    }


def test_anthropic_is_the_family_of_its_name() -> None:
    assert family("anthropic") is ANTHROPIC


def test_anthropic_opens_its_message_batches_but_has_no_background_responses() -> None:
    settings = Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="arn")
    anthropic = replace(settings, provider="anthropic")

    async def opened() -> object:
        async with apis.batch_api_for(anthropic, "sk-ant-x")() as api:
            return api

    assert isinstance(asyncio.run(opened()), AnthropicBatchApi)
    with pytest.raises(ValueError, match="the anthropic provider has no background responses"):
        apis.background_api("anthropic")
    assert apis.batch_api_for(settings, "sk-x") is not None
    assert apis.background_api("openai") is not None


def test_every_request_authenticates_with_a_key_header_and_the_api_version() -> None:
    assert ANTHROPIC.auth_headers("sk-ant-x") == {"x-api-key": "sk-ant-x", "anthropic-version": "2023-06-01"}


@pytest.mark.parametrize(
    ("base", "path", "expected"),
    [
        ("https://api.anthropic.com", MESSAGES, "https://api.anthropic.com/v1/messages"),
        ("https://api.anthropic.com/", CHAT, "https://api.anthropic.com/v1/messages"),
        ("http://127.0.0.1:8000/v1", CHAT, "http://127.0.0.1:8000/v1/messages"),
    ],
)
def test_every_line_goes_to_the_messages_endpoint(base: str, path: str, expected: str) -> None:
    assert ANTHROPIC.url(base, path) == expected


def test_what_a_messages_request_asks() -> None:
    body = {
        "model": "claude",
        "max_tokens": 300,
        "system": "s" * 40,
        "messages": [{"role": "user", "content": "x" * 40}],
    }
    assert ANTHROPIC.model(body) == "claude"
    assert ANTHROPIC.output_cap(body, MESSAGES, default=7) == 300
    assert ANTHROPIC.output_cap({}, MESSAGES, default=7) == 7
    # Anthropic's token limit that admits a request counts its input only: its text's characters / 4
    assert ANTHROPIC.estimate_tokens(body, MESSAGES, default_output=1000) == 21


def test_usage_reads_a_native_and_a_translated_answer_alike() -> None:
    native = answer(cache_read_input_tokens=100, cache_creation_input_tokens=8)
    # the cache's reads and writes are part of the input, and counted apart to be priced apart;
    # a chat.completion's prompt_tokens_details keeps the reads only
    assert ANTHROPIC.usage(native) == Usage(120, 5, cached_in=100, cache_write=8)
    assert ANTHROPIC.usage(ANTHROPIC.from_wire(CHAT, native, 0)) == Usage(120, 5, cached_in=100)
    # the input limit counts what the prompt cache did not serve
    assert ANTHROPIC.counted_tokens(native) == 20
    assert ANTHROPIC.usage({"usage": {}}) is None
    assert ANTHROPIC.answered_model(native) == "claude-3-5-haiku-latest"


@pytest.mark.parametrize(
    ("stop_reason", "finish", "finish_reason"),
    [
        ("end_turn", COMPLETE, "stop"),
        ("stop_sequence", COMPLETE, "stop"),
        ("max_tokens", CUT_SHORT, "length"),
        ("model_context_window_exceeded", CUT_SHORT, "length"),
        ("tool_use", COMPLETE, "tool_calls"),
        ("refusal", COMPLETE, "content_filter"),
    ],
)
def test_each_stop_reason_ends_an_answer_and_maps_to_a_finish_reason(
    stop_reason: str, finish: str, finish_reason: str
) -> None:
    native = answer(stop_reason)
    translated = ANTHROPIC.from_wire(CHAT, native, 1_700_000_000)
    assert translated["choices"][0]["finish_reason"] == finish_reason
    assert ANTHROPIC.finish(native) == finish
    assert ANTHROPIC.finish(translated) == finish


def test_a_chat_line_answered_comes_back_as_a_chat_completion() -> None:
    translated = ANTHROPIC.from_wire(CHAT, answer(), 1_700_000_000)
    assert translated == {
        "id": "msg_01",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "claude-3-5-haiku-latest",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 5,
            "total_tokens": 17,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }


def test_a_tool_use_answer_carries_its_calls() -> None:
    native = answer("tool_use")
    native["content"] = [{"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Oslo"}}]
    message = ANTHROPIC.from_wire(CHAT, native, 0)["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": '{"city":"Oslo"}'}}
    ]


def test_a_messages_line_and_its_answer_stay_native() -> None:
    body = {"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], "top_k": 5}
    assert ANTHROPIC.to_wire(MESSAGES, body) is body
    native = answer()
    assert ANTHROPIC.from_wire(MESSAGES, native, 0) is native


def test_a_chat_body_becomes_a_messages_body() -> None:
    body = {
        "model": "claude-3-5-haiku-latest",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use English."}]},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        ],
        "max_completion_tokens": 200,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": "END",
        "user": "u-1",
        "n": 1,
        "logprobs": False,
        "store": False,
    }
    assert ANTHROPIC.to_wire(CHAT, body) == {
        "model": "claude-3-5-haiku-latest",
        "max_tokens": 200,
        "system": "Be brief.\n\nUse English.",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}],
            },
        ],
        "temperature": 0.2,
        "top_p": 0.9,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
    }


def test_a_chat_body_without_a_cap_gets_the_default_and_a_stop_list_stays_a_list() -> None:
    wire = ANTHROPIC.to_wire(CHAT, {"model": "c", "messages": [{"role": "user", "content": "x"}], "stop": ["a", "b"]})
    assert wire["max_tokens"] == DEFAULT_MAX_TOKENS
    assert wire["stop_sequences"] == ["a", "b"]
    assert "system" not in wire


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"n": 2}, "n:"),
        ({"logprobs": True}, "logprobs:"),
        ({"top_logprobs": 3}, "top_logprobs:"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format:"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools:"),
        ({"presence_penalty": 0.5}, "presence_penalty:"),
        ({"temperature": 1.5}, "temperature:"),
        ({"frobnicate": 1}, "frobnicate:"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "role 'tool'"),
    ],
)
def test_a_chat_field_messages_cannot_honour_is_refused_by_name(extra: dict[str, Any], named: str) -> None:
    body = {"model": "c", "messages": [{"role": "user", "content": "x"}], **extra}
    with pytest.raises(Unsupported, match=named):
        ANTHROPIC.to_wire(CHAT, body)


def test_a_line_anthropic_cannot_send_is_an_error_naming_the_field() -> None:
    raw = orjson.dumps(
        {"custom_id": "a", "method": "POST", "url": CHAT, "body": {"model": "c", "messages": [], "n": 4}}
    )
    error = parse_line(raw, 3, request_format=ANTHROPIC)
    assert isinstance(error, LineError)
    assert (error.code, error.custom_id) == (ErrorCode.UNSUPPORTED_FIELD, "a")
    assert error.message.startswith("line 3: n: 4 asked for")
    embeddings = orjson.dumps({"custom_id": "b", "method": "POST", "url": "/v1/embeddings", "body": {"model": "c"}})
    refused = parse_line(embeddings, 4, request_format=ANTHROPIC)
    assert isinstance(refused, LineError)
    assert refused.code == ErrorCode.UNSUPPORTED_URL
    assert "/v1/chat/completions, /v1/messages" in refused.message


def test_a_chat_line_read_for_anthropic_holds_the_messages_body_under_its_own_path() -> None:
    raw = orjson.dumps(
        {
            "custom_id": "a",
            "method": "POST",
            "url": CHAT,
            "body": {"model": "c", "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "x"}]},
        }
    )
    request = parse_line(raw, 1, request_format=ANTHROPIC, sort_keys=True)
    assert isinstance(request, Request)
    assert request.path == CHAT
    assert orjson.loads(request.body or b"") == {
        "max_tokens": DEFAULT_MAX_TOKENS,
        "messages": [{"content": "x", "role": "user"}],
        "model": "c",
        "system": "S",
    }


def test_an_error_body_says_its_type_and_message() -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "request_id": "req_1"}
    assert ANTHROPIC.error(body) == ProviderError("overloaded_error", "Overloaded")
    assert ANTHROPIC.error("<html>") == ProviderError()
    assert ANTHROPIC.request_id(None, body) == "req_1"
    assert ANTHROPIC.request_id({"request-id": "req_2"}, body) == "req_2"
    assert ANTHROPIC.request_id({}, answer()) == "msg_01"


def test_overloaded_and_rate_limited_answers_throttle() -> None:
    assert {429, 529} <= ANTHROPIC.throttle_statuses
    assert {"overloaded_error", "rate_limit_error"} <= ANTHROPIC.congestion_codes


HEADERS = {
    "anthropic-ratelimit-requests-limit": "60",
    "anthropic-ratelimit-requests-remaining": "59",
    "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:01Z",
    "anthropic-ratelimit-tokens-limit": "12000",
    "anthropic-ratelimit-tokens-remaining": "100",
    "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:30Z",
    "anthropic-ratelimit-input-tokens-limit": "30000",
    "anthropic-ratelimit-input-tokens-remaining": "29000",
    "anthropic-ratelimit-input-tokens-reset": "2026-01-01T00:00:02.500Z",
}


def test_the_rate_limit_headers_say_the_input_limits_a_second() -> None:
    assert ANTHROPIC.rate_limits(HEADERS) == RateLimits(1.0, 500.0)
    assert ANTHROPIC.left(HEADERS, "requests") == 59
    assert ANTHROPIC.left(HEADERS, "tokens") == 29000
    assert ANTHROPIC.reset_s(HEADERS, "requests", NOW) == 1.0
    assert ANTHROPIC.reset_s(HEADERS, "tokens", NOW) == 2.5
    assert ANTHROPIC.rate_limits({}) == RateLimits()


def test_without_input_headers_the_tokens_ones_count() -> None:
    headers = {k: v for k, v in HEADERS.items() if "input-tokens" not in k}
    assert ANTHROPIC.rate_limits(headers) == RateLimits(1.0, 200.0)
    assert ANTHROPIC.left(headers, "tokens") == 100
    assert ANTHROPIC.reset_s(headers, "tokens", NOW) == 30.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2026-01-01T00:00:05Z", 5.0), ("2026-01-01T01:00:05+01:00", 5.0), ("2025-12-31T23:59:00Z", 0.0)],
)
def test_resets_are_rfc_3339_times(text: str, expected: float) -> None:
    assert parse_reset(text, NOW) == expected


@pytest.mark.parametrize("text", ["5s", "soon", "2026-01-01T00:00:05", ""])
def test_a_reset_that_is_no_time_says_nothing(text: str) -> None:
    assert parse_reset(text, NOW) is None
