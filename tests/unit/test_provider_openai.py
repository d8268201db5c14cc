"""OpenAI's request format (`sluice.providers.openai`): what a request asks, what an answer and its
headers say, as every OpenAI-compatible provider writes them."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from sluice.contract import DEFAULT_PROVIDER, PROVIDERS
from sluice.providers import COMPLETE, CUT_SHORT, OPENAI, UNFINISHED, ProviderError, RateLimits, Usage, family
from sluice.providers.openai.format import join_url, parse_reset_s

MESSAGES = [{"role": "user", "content": "x" * 40}]


def test_openai_is_the_family_of_its_name_and_the_default() -> None:
    assert family("openai") is OPENAI
    assert [family(name).name for name in PROVIDERS] == ["openai", "anthropic", "bedrock", "gemini"]
    assert family(DEFAULT_PROVIDER) is OPENAI
    with pytest.raises(
        ValueError, match="unknown provider family 'vertex'; expected one of openai, anthropic, bedrock"
    ):
        family("vertex")


def test_an_openai_line_goes_and_comes_back_as_it_is() -> None:
    body = {"model": "m", "messages": MESSAGES, "n": 3, "logprobs": True}
    assert OPENAI.to_wire("/v1/chat/completions", body) is body
    answer = {"id": "chatcmpl-1", "choices": []}
    assert OPENAI.from_wire("/v1/chat/completions", answer, 0) is answer


def test_every_request_authenticates_with_a_bearer_key() -> None:
    assert OPENAI.auth_headers("sk-x") == {"Authorization": "Bearer sk-x"}


@pytest.mark.parametrize(
    ("base", "path", "expected"),
    [
        ("http://h:8000/v1", "/v1/chat/completions", "http://h:8000/v1/chat/completions"),
        ("http://h:8000/v1/", "/v1/chat/completions", "http://h:8000/v1/chat/completions"),
        # as the openai SDK joins them: a base URL without its version reaches a path without one
        ("http://h:8000", "/v1/chat/completions", "http://h:8000/chat/completions"),
        ("https://h/openai/v1", "/v1/responses/resp_1", "https://h/openai/v1/responses/resp_1"),
        ("https://h/api", "/v1/embeddings", "https://h/api/embeddings"),
        ("https://h/v1", "/v1beta/x", "https://h/v1/v1beta/x"),
    ],
)
def test_join_url(base: str, path: str, expected: str) -> None:
    assert join_url(base, path) == expected
    assert OPENAI.url(base, path) == expected


def test_model_comes_from_the_body() -> None:
    assert OPENAI.model({"model": "m1"}) == "m1"
    assert OPENAI.model({"model": 7}) == ""
    assert OPENAI.model({}) == ""


def test_the_output_cap_is_the_first_cap_the_body_sets_times_its_answers() -> None:
    chat = "/v1/chat/completions"
    assert OPENAI.output_cap({"max_tokens": 100}, chat, default=9) == 100
    # max_completion_tokens is read first; n answers each may take it
    assert OPENAI.output_cap({"max_completion_tokens": 10, "max_tokens": 99, "n": 3}, chat, default=9) == 30
    assert OPENAI.output_cap({"max_output_tokens": 5}, "/v1/responses", default=9) == 5
    # no cap, or none a request could set (0, a bool): the caller's default, times n
    assert OPENAI.output_cap({"n": 2}, chat, default=9) == 18
    assert OPENAI.output_cap({"max_tokens": 0, "n": True}, chat, default=9) == 9
    assert OPENAI.output_cap({"max_completion_tokens": False, "max_tokens": 4}, chat, default=9) == 4
    # an embedding produces no output
    assert OPENAI.output_cap({"max_tokens": 100}, "/v1/embeddings", default=9) == 0


def test_a_requests_token_cost_is_its_input_estimate_plus_its_most_output() -> None:
    chat = "/v1/chat/completions"
    # "user" and the content: 44 characters, 11 tokens; 16 out
    assert OPENAI.estimate_tokens({"model": "m", "messages": MESSAGES, "max_tokens": 16}, chat, default_output=7) == 27
    assert (
        OPENAI.estimate_tokens(
            {"messages": MESSAGES, "max_completion_tokens": 10, "max_tokens": 99, "n": 3}, chat, default_output=7
        )
        == 11 + 30
    )
    assert OPENAI.estimate_tokens({"input": "y" * 80, "max_output_tokens": 5}, "/v1/responses", default_output=7) == 25
    # no limit on the output: the caller's default until the answer settles it
    assert OPENAI.estimate_tokens({"messages": MESSAGES}, chat, default_output=7) == 11 + 7
    assert (
        OPENAI.estimate_tokens({"prompt": "z" * 8, "instructions": "w" * 4}, "/v1/completions", default_output=0) == 3
    )
    assert OPENAI.estimate_tokens({"input": ["a" * 8, "b" * 8]}, "/v1/embeddings", default_output=7) == 4


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}, Usage(10, 5)),
        ({"usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}}, Usage(7, 3)),
        # an embedding takes only input
        ({"usage": {"prompt_tokens": 8, "total_tokens": 8}}, Usage(8, 0)),
        ({"usage": {"prompt_tokens": 8, "completion_tokens": "x"}}, Usage(8, 0)),
        # a background response still running has no usage yet
        ({"id": "resp_1", "status": "queued", "usage": None}, None),
        ({"usage": {"completion_tokens": 3}}, None),
        ({"id": "x"}, None),
        (None, None),
        ("text", None),
    ],
)
def test_usage_says_what_an_answer_took(body: Any, expected: Usage | None) -> None:
    assert OPENAI.usage(body) == expected


def test_an_answer_counts_its_total_tokens_against_the_limit_else_what_it_states() -> None:
    assert OPENAI.counted_tokens({"usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}) == 15
    assert OPENAI.counted_tokens({"usage": {"total_tokens": 20}}) == 20
    assert OPENAI.counted_tokens({"usage": {"input_tokens": 7, "output_tokens": 3}}) == 10
    assert OPENAI.counted_tokens({"usage": {"completion_tokens": 3}}) == 3
    assert OPENAI.counted_tokens({"usage": {}}) is None
    assert OPENAI.counted_tokens({"id": "x"}) is None
    assert OPENAI.counted_tokens(None) is None


def test_the_answering_model_is_the_bodys() -> None:
    assert OPENAI.answered_model({"model": "gpt-4o-mini-2024-07-18"}) == "gpt-4o-mini-2024-07-18"
    assert OPENAI.answered_model({"model": None}) is None
    assert OPENAI.answered_model(["model"]) is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"choices": [{"finish_reason": "stop"}]}, COMPLETE),
        ({"choices": [{"finish_reason": "stop"}, {"finish_reason": "length"}]}, CUT_SHORT),
        ({"status": "completed", "output": []}, COMPLETE),
        ({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}, CUT_SHORT),
        ({"status": "in_progress"}, UNFINISHED),
        ({"status": "failed"}, UNFINISHED),
        ({"data": [{"embedding": [0.1]}]}, COMPLETE),
    ],
)
def test_an_answer_finished_whole_cut_short_or_not_at_all(body: dict[str, Any], expected: str) -> None:
    assert OPENAI.finish(body) == expected


def test_an_answers_id_is_its_request_id_header_else_its_body_id() -> None:
    assert OPENAI.request_id({"x-request-id": "req_1"}, {"id": "chatcmpl-1"}) == "req_1"
    assert OPENAI.request_id({}, {"id": "chatcmpl-1"}) == "chatcmpl-1"
    assert OPENAI.request_id(None, {"id": 5}) is None
    assert OPENAI.request_id(CIMultiDictProxy(CIMultiDict({"X-Request-Id": "req_2"})), None) == "req_2"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"error": {"message": "bad model", "code": "model_not_found"}}, ProviderError("model_not_found", "bad model")),
        ({"error": {"message": "slow down", "type": "requests", "code": None}}, ProviderError("requests", "slow down")),
        ({"error": "overloaded"}, ProviderError("overloaded")),
        ({"code": 42, "detail": "no such route"}, ProviderError("42", "no such route")),
        ({"object": "error", "message": "vLLM says no"}, ProviderError(None, "vLLM says no")),
        ("<html>502</html>", ProviderError()),
        (None, ProviderError()),
    ],
)
def test_an_error_body_says_its_code_and_message_whatever_its_shape(body: Any, expected: ProviderError) -> None:
    assert OPENAI.error(body) == expected


def test_congestion_is_a_429_or_one_of_the_codes_openai_compatible_servers_send() -> None:
    assert OPENAI.throttle_statuses == frozenset({429})
    assert {"queue_wait_exceeded", "max_queue_wait_exceeded", "rate_limit_exceeded", "server_overloaded"} <= (
        OPENAI.congestion_codes
    )
    assert "overloaded" in OPENAI.congestion_codes
    assert "invalid_request_error" not in OPENAI.congestion_codes


def test_rates_are_read_from_the_per_minute_headers() -> None:
    assert OPENAI.rate_limits({"x-ratelimit-limit-requests": "1200"}) == RateLimits(20.0, None)
    both = OPENAI.rate_limits({"x-ratelimit-limit-requests": "300", "x-ratelimit-limit-tokens": "150000"})
    assert both == RateLimits(5.0, 2500.0)
    for nonsense in ("nan", "zero", "0", "-5", "inf"):
        assert OPENAI.rate_limits({"x-ratelimit-limit-requests": nonsense}) == RateLimits()
    assert OPENAI.rate_limits({}) == RateLimits()


def test_what_is_left_is_read_as_a_number_or_not_at_all() -> None:
    headers = {"x-ratelimit-remaining-requests": "12", "x-ratelimit-remaining-tokens": "0"}
    assert OPENAI.left(headers, "requests") == 12.0
    assert OPENAI.left(headers, "tokens") == 0.0
    assert OPENAI.left({"x-ratelimit-remaining-requests": "lots"}, "requests") is None
    assert OPENAI.left({}, "tokens") is None
    aiohttp_headers = CIMultiDictProxy(CIMultiDict({"X-RateLimit-Remaining-Requests": "3"}))
    assert OPENAI.left(aiohttp_headers, "requests") == 3.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1s", 1.0),
        ("20ms", 0.02),
        ("6m0s", 360.0),
        ("1h2m3.5s", 3723.5),
        ("0.5", 0.5),
        ("2", 2.0),
        ("", None),
        ("soon", None),
        ("1s junk", None),
        ("-1", None),
    ],
)
def test_parse_reset(text: str, expected: float | None) -> None:
    got = parse_reset_s(text)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_a_reset_is_read_from_its_kinds_header() -> None:
    headers = {"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "20ms"}
    assert OPENAI.reset_s(headers, "requests", 0.0) == pytest.approx(360.0)
    assert OPENAI.reset_s(headers, "tokens", 0.0) == pytest.approx(0.02)
    assert OPENAI.reset_s({"x-ratelimit-reset-tokens": ""}, "tokens", 0.0) is None
    assert OPENAI.reset_s({}, "requests", 0.0) is None
