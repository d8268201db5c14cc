"""Amazon Bedrock's request format (`sluice.providers.bedrock`): chat lines translated to the Converse
API and answered as chat.completions, Messages lines sent to InvokeModel and answered natively, the
model in the URL, errors by their `x-amzn-ErrorType`, and each request signed with SigV4."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from botocore.credentials import Credentials
from sluice.contract.model import ErrorCode, Request
from sluice.core.retry import RetryPolicy
from sluice.formats.lines import LineError, parse_line
from sluice.providers import BEDROCK, COMPLETE, CUT_SHORT, Unsupported, Usage, family, modes
from sluice.providers.bedrock import auth
from sluice.providers.signing import signed
from sluice.send.classify import FAIL, RETRY, classify

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
MODEL = "anthropic.claude-3-haiku-20240307-v1:0"


def chat_line(**body: Any) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **body}
    return orjson.dumps({"custom_id": "a", "method": "POST", "url": CHAT, "body": body})


def converse_answer(stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": "Hello"}, {"text": " there"}]}},
        "stopReason": stop_reason,
        "usage": {"inputTokens": 12, "outputTokens": 3, "totalTokens": 15},
        "metrics": {"latencyMs": 120},
    }


def test_bedrock_is_a_family_that_runs_direct_and_batch_but_not_background() -> None:
    assert family("bedrock") is BEDROCK
    assert modes("bedrock") == frozenset({"direct", "batch"})


def test_a_chat_line_is_kept_as_a_converse_body_naming_its_model() -> None:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Again"},
        ],
        "max_tokens": 50,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": "END",
        "user": "u-1",
    }
    assert BEDROCK.to_wire(CHAT, body) == {
        "model": MODEL,
        "system": [{"text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"text": "Hi"}]},
            {"role": "assistant", "content": [{"text": "Hello"}]},
            {"role": "user", "content": [{"text": "Again"}]},
        ],
        "inferenceConfig": {"maxTokens": 50, "temperature": 0.2, "topP": 0.9, "stopSequences": ["END"]},
    }


def test_function_tools_translate_to_a_tool_config() -> None:
    tool = {"type": "function", "function": {"name": "rate", "description": "d", "parameters": {"type": "object"}}}
    wire = BEDROCK.to_wire(CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [tool]})
    spec = {"name": "rate", "inputSchema": {"json": {"type": "object"}}, "description": "d"}
    assert wire["toolConfig"] == {"tools": [{"toolSpec": spec}]}


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 2), ("logprobs", True), ("response_format", {"type": "json_object"}), ("seed", 7), ("frobnicate", 1)],
)
def test_what_converse_cannot_honour_is_refused_at_plan_naming_the_field(field: str, value: Any) -> None:
    parsed = parse_line(chat_line(**{field: value}), 3, request_format=BEDROCK)
    assert isinstance(parsed, LineError)
    assert parsed.code == ErrorCode.UNSUPPORTED_FIELD
    assert parsed.message.startswith(f"line 3: {field}:") and "Converse" in parsed.message


def test_a_tool_turn_and_a_line_without_a_model_are_refused() -> None:
    tool_turn = {"model": MODEL, "messages": [{"role": "tool", "content": "42", "tool_call_id": "t"}]}
    with pytest.raises(Unsupported, match="role 'tool'"):
        BEDROCK.to_wire(CHAT, tool_turn)
    with pytest.raises(Unsupported, match="model"):
        BEDROCK.to_wire(CHAT, {"messages": [{"role": "user", "content": "x"}]})


def test_the_model_goes_in_the_url_encoded_and_leaves_the_body() -> None:
    request = parse_line(chat_line(max_tokens=5), 1, request_format=BEDROCK)
    assert isinstance(request, Request) and request.body is not None
    assert BEDROCK.model_in_url and BEDROCK.model(orjson.loads(request.body)) == MODEL
    path, body = BEDROCK.route(CHAT, request.body)
    assert path == "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"
    assert body is not None and "model" not in orjson.loads(body)
    assert BEDROCK.url("https://bedrock-runtime.eu-west-1.amazonaws.com/", path) == (
        "https://bedrock-runtime.eu-west-1.amazonaws.com/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"
    )


def test_a_messages_line_goes_to_invoke_model_with_bedrocks_version_and_no_model() -> None:
    native = {"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "Hi"}]}
    wire = BEDROCK.to_wire(MESSAGES, native)
    assert wire["anthropic_version"] == "bedrock-2023-05-31"
    path, body = BEDROCK.route(MESSAGES, orjson.dumps(wire))
    assert path.endswith("/invoke")
    assert body is not None and orjson.loads(body) == {
        "max_tokens": 20,
        "messages": [{"role": "user", "content": "Hi"}],
        "anthropic_version": "bedrock-2023-05-31",
    }
    answer = {
        "id": "msg_bdrk_1",
        "type": "message",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
    }
    assert BEDROCK.from_wire(MESSAGES, answer, 0, sent=orjson.dumps(wire), request_id="r") is answer


def test_a_converse_answer_comes_back_as_a_chat_completion() -> None:
    sent = orjson.dumps(BEDROCK.to_wire(CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}))
    body = BEDROCK.from_wire(CHAT, converse_answer(), 1_700_000_000, sent=sent, request_id="req-1")
    assert body == {
        "id": "req-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }
    assert BEDROCK.usage(body) == Usage(12, 3) and BEDROCK.answered_model(body) == MODEL
    assert BEDROCK.usage(converse_answer()) == Usage(12, 3)


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason", "finish"),
    [
        ("end_turn", "stop", COMPLETE),
        ("stop_sequence", "stop", COMPLETE),
        ("max_tokens", "length", CUT_SHORT),
        ("tool_use", "tool_calls", COMPLETE),
        ("content_filtered", "content_filter", COMPLETE),
        ("guardrail_intervened", "content_filter", COMPLETE),
    ],
)
def test_the_stop_reason_maps_to_a_finish_reason(stop_reason: str, finish_reason: str, finish: str) -> None:
    body = BEDROCK.from_wire(CHAT, converse_answer(stop_reason), 0, sent=orjson.dumps({"model": MODEL}))
    assert body["choices"][0]["finish_reason"] == finish_reason
    assert BEDROCK.finish(body) == finish == BEDROCK.finish(converse_answer(stop_reason))


def test_a_tool_use_answer_comes_back_as_tool_calls() -> None:
    answer = converse_answer("tool_use")
    answer["output"]["message"]["content"] = [{"toolUse": {"toolUseId": "t1", "name": "rate", "input": {"x": 1}}}]
    message = BEDROCK.from_wire(CHAT, answer, 0)["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "rate", "arguments": '{"x":1}'}}
    ]


POLICY = RetryPolicy(max_attempts=3, base_delay_s=1.0)


def attempt(status: int, error_type: str) -> tuple[str, bool, str | None]:
    headers = {"x-amzn-ErrorType": f"{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    verdict = classify(
        status,
        headers,
        orjson.dumps({"message": "why"}),
        None,
        attempt=1,
        policy=POLICY,
        request_format=BEDROCK,
        now=0.0,
        rand=lambda: 0.5,
    )
    return verdict.kind, verdict.throttled, verdict.code


@pytest.mark.parametrize(
    ("status", "error_type", "expected"),
    [
        (429, "ThrottlingException", (RETRY, True, None)),
        (503, "ServiceUnavailableException", (RETRY, True, None)),
        (429, "ModelNotReadyException", (RETRY, False, None)),
        (408, "ModelTimeoutException", (RETRY, False, None)),
        (500, "InternalServerException", (RETRY, False, None)),
        (400, "ValidationException", (FAIL, False, ErrorCode.PROVIDER_ERROR)),
        (403, "AccessDeniedException", (FAIL, False, ErrorCode.PROVIDER_ERROR)),
        (404, "ResourceNotFoundException", (FAIL, False, ErrorCode.PROVIDER_ERROR)),
    ],
)
def test_errors_are_classified_by_the_type_bedrock_names_in_its_header(
    status: int, error_type: str, expected: tuple[str, bool, str | None]
) -> None:
    assert attempt(status, error_type) == expected
    said = BEDROCK.error({"message": "why"}, {"x-amzn-errortype": error_type})
    assert (said.code, said.message) == (error_type, "why")


def test_the_request_id_is_bedrocks_header() -> None:
    assert BEDROCK.request_id({"x-amzn-RequestId": "abc"}, {}) == "abc"
    assert BEDROCK.rate_limits({"x-amzn-RequestId": "abc"}).requests_per_s is None


def test_the_estimate_counts_the_input_and_the_output_cap() -> None:
    wire = BEDROCK.to_wire(CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 7})
    # the text of the messages, their roles among it, a token a 4 characters
    assert BEDROCK.estimate_tokens(wire, CHAT, default_output=100) == (40 + 4) // 4 + 7
    assert BEDROCK.output_cap({"max_tokens": 9}, MESSAGES, default=100) == 9


def test_the_endpoint_follows_boto3s_configuration() -> None:
    assert auth.endpoint({}, "eu-west-3") == "https://bedrock-runtime.eu-west-3.amazonaws.com"
    assert auth.endpoint({"AWS_ENDPOINT_URL": "http://proxy:1/"}, "eu-west-3") == "http://proxy:1"
    both = {"AWS_ENDPOINT_URL": "http://proxy:1", "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": "http://rt:2"}
    assert auth.endpoint(both, "eu-west-3") == "http://rt:2"


class FakeSession:
    region_name = "us-west-2"

    def get_credentials(self) -> Credentials:
        return Credentials("AKIDEXAMPLE", "not-to-be-seen", "the-token")


def test_each_request_is_signed_for_bedrock_in_the_region_and_never_carries_the_secret() -> None:
    found = signed("bedrock", FakeSession(), {})
    assert found is not None and signed("openai", FakeSession(), {}) is None
    endpoint, sign = found
    assert endpoint == "https://bedrock-runtime.us-west-2.amazonaws.com"
    url = endpoint + "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"
    headers = sign("POST", url, {"Content-Type": "application/json"}, b"{}")
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/us-west-2/bedrock/aws4_request" in headers["Authorization"]
    assert headers["X-Amz-Security-Token"] == "the-token" and headers["X-Amz-Date"]
    assert "not-to-be-seen" not in repr(headers)
    # signed again (a retry) it is signed anew, not twice
    again = sign("POST", url, headers, b"{}")
    assert again["Authorization"].count("AWS4-HMAC-SHA256") == 1
