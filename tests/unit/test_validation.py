"""Per-line output validation (issue 33): each check, on each path's answers, whichever family gave them."""

from __future__ import annotations

from typing import Any

import pytest
from sluice.contract import VALIDATION_CHECKS, parse_validate
from sluice.formats.validation import Invalid, Validator
from sluice.providers import ANTHROPIC, answers

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ALL = Validator(frozenset(VALIDATION_CHECKS))


def chat_request(schema: dict[str, Any] | None = SCHEMA) -> dict[str, Any]:
    fmt: dict[str, Any] = (
        {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
        if schema is not None
        else {"type": "json_object"}
    )
    return {"model": "m", "messages": [{"role": "user", "content": "who?"}], "response_format": fmt}


def chat(content: str | None, finish: str = "stop", refusal: str | None = None, calls: tuple[str, ...] = ()) -> Any:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    if calls:
        message["tool_calls"] = [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": a}} for a in calls
        ]
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def responses_request() -> dict[str, Any]:
    return {"model": "m", "input": "who?", "text": {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}}}


def response(
    text: str | None, *, status: str = "completed", reason: str | None = None, refusal: str | None = None
) -> Any:
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "output_text", "text": text})
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    details = {"reason": reason} if reason else None
    output = [{"type": "message", "role": "assistant", "content": content}]
    return {"object": "response", "status": status, "incomplete_details": details, "output": output}


def messages_request() -> dict[str, Any]:
    return {"model": "m", "max_tokens": 100, "messages": [], "output_format": {"type": "json_schema", "schema": SCHEMA}}


def message(text: str | None, stop: str = "end_turn", tool_input: dict[str, Any] | None = None) -> Any:
    content: list[dict[str, Any]] = [] if text is None else [{"type": "text", "text": text}]
    if tool_input is not None:
        content.append({"type": "tool_use", "id": "t", "name": "f", "input": tool_input})
    return {"type": "message", "content": content, "stop_reason": stop}


GOOD = '{"name": "Ada", "age": 36}'
OFF_SCHEMA = '{"name": "Ada", "age": "36"}'
BROKEN = '{"name": "Ada", "age'


def check_of(found: Invalid | None) -> str | None:
    return found.check if found is not None else None


@pytest.mark.parametrize(
    ("path", "request_body", "answer", "check"),
    [
        (CHAT, chat_request(), chat(GOOD), None),
        (CHAT, chat_request(), chat(OFF_SCHEMA), "schema"),
        (CHAT, chat_request(), chat(BROKEN), "json"),
        (CHAT, chat_request(), chat(BROKEN, finish="length"), "cut_short"),
        (CHAT, chat_request(), chat(None, refusal="I can't help with that"), "refusal"),
        (CHAT, chat_request(), chat("", finish="content_filter"), "refusal"),
        (CHAT, chat_request(), chat("  "), "empty"),
        (CHAT, chat_request(schema=None), chat(OFF_SCHEMA), None),
        (CHAT, chat_request(schema=None), chat("not json"), "json"),
        (CHAT, {"model": "m", "messages": []}, chat("plain prose is fine"), None),
        (CHAT, {"model": "m", "messages": []}, chat(None, calls=('{"x": 1}',)), None),
        (CHAT, {"model": "m", "messages": []}, chat(None, calls=('{"x": ',)), "json"),
        (RESPONSES, responses_request(), response(GOOD), None),
        (RESPONSES, responses_request(), response(OFF_SCHEMA), "schema"),
        (RESPONSES, responses_request(), response(BROKEN), "json"),
        (
            RESPONSES,
            responses_request(),
            response(BROKEN, status="incomplete", reason="max_output_tokens"),
            "cut_short",
        ),
        (RESPONSES, responses_request(), response(None, refusal="no"), "refusal"),
        (RESPONSES, responses_request(), response(None, status="incomplete", reason="content_filter"), "refusal"),
        (RESPONSES, responses_request(), response(None), "empty"),
        (MESSAGES, messages_request(), message(GOOD), None),
        (MESSAGES, messages_request(), message(OFF_SCHEMA), "schema"),
        (MESSAGES, messages_request(), message(BROKEN), "json"),
        (MESSAGES, messages_request(), message(BROKEN, stop="max_tokens"), "cut_short"),
        (MESSAGES, messages_request(), message(None, stop="refusal"), "refusal"),
        (MESSAGES, messages_request(), message(None), "empty"),
        (MESSAGES, {"model": "m", "max_tokens": 9, "messages": []}, message(None, tool_input={"x": 1}), None),
    ],
)
def test_every_check_reads_each_paths_answers(path: str, request_body: Any, answer: Any, check: str | None) -> None:
    assert check_of(ALL.validate(path, request_body, answer)) == check


def test_a_check_turned_off_lets_its_fault_pass() -> None:
    only_json = Validator(frozenset({"json"}))
    assert only_json.validate(CHAT, chat_request(), chat(OFF_SCHEMA)) is None
    assert only_json.validate(CHAT, chat_request(), chat(None, refusal="no")) is None
    assert check_of(only_json.validate(CHAT, chat_request(), chat(BROKEN))) == "json"
    assert not Validator(frozenset())
    assert Validator(frozenset()).validate(CHAT, chat_request(), chat(BROKEN)) is None


def test_schema_without_json_still_fails_what_cannot_match() -> None:
    found = Validator(frozenset({"schema"})).validate(CHAT, chat_request(), chat(BROKEN))
    assert found is not None and found.check == "schema" and "not valid JSON" in found.message


def test_the_validators_message_says_what_is_wrong() -> None:
    found = ALL.validate(CHAT, chat_request(), chat(OFF_SCHEMA))
    assert found == Invalid("schema", "the answer does not match the schema: data.age must be integer")


def test_a_schema_the_job_names_applies_to_lines_that_give_none() -> None:
    named = Validator(frozenset(VALIDATION_CHECKS), schema=SCHEMA)
    plain = {"model": "m", "messages": []}
    assert check_of(named.validate(CHAT, plain, chat(OFF_SCHEMA))) == "schema"
    assert check_of(named.validate(CHAT, plain, chat("prose"))) == "json"
    assert named.validate(CHAT, plain, chat(GOOD)) is None


def test_a_chat_line_answered_by_anthropic_validates_as_a_chat_answer() -> None:
    for native, check in (
        (message(GOOD), None),
        (message(OFF_SCHEMA), "schema"),
        (message(GOOD, "max_tokens"), "cut_short"),
    ):
        translated = ANTHROPIC.from_wire(CHAT, native, 0)
        assert check_of(ALL.validate(CHAT, chat_request(), translated)) == check


def test_embeddings_are_not_read() -> None:
    assert ALL.validate("/v1/embeddings", {"input": "x"}, {"data": [{"embedding": [0.1]}]}) is None


def test_repair_adds_the_answer_and_the_validators_message_as_turns() -> None:
    body = chat_request()
    repaired = answers.repair(CHAT, body, OFF_SCHEMA, "data.age must be integer")
    assert repaired["messages"][-2:] == [
        {"role": "assistant", "content": OFF_SCHEMA},
        {"role": "user", "content": "data.age must be integer"},
    ]
    assert body["messages"] == [{"role": "user", "content": "who?"}]
    assert answers.repair(RESPONSES, responses_request(), "x", "fix")["input"][0] == {"role": "user", "content": "who?"}
    assert answers.repair(MESSAGES, messages_request(), "x", "fix")["messages"][-1] == {
        "role": "user",
        "content": "fix",
    }


@pytest.mark.parametrize(
    ("text", "checks"),
    [
        ("all", VALIDATION_CHECKS),
        ("", ()),
        ("off", ()),
        ("schema,json", ("json", "schema")),
        ("JSON, cut_short", ("json", "cut_short")),
    ],
)
def test_the_validate_option_names_checks(text: str, checks: tuple[str, ...]) -> None:
    assert parse_validate(text) == checks


def test_an_unknown_check_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"schemas.*expected all or some of json, schema"):
        parse_validate("schemas")


def test_one_schema_is_compiled_once() -> None:
    from sluice.formats import validation

    schema = {"type": "object", "required": ["only_here"]}
    validation.schema_error(schema, {})
    first = validation.compiled(dict(reversed(list(schema.items()))))
    assert validation.compiled(schema) is first
    assert validation.schema_error(schema, {"only_here": 1}) is None


def test_the_contract_names_every_check_the_validator_runs() -> None:
    from sluice.formats import validation

    assert sorted(validation.CHECKS) == sorted(VALIDATION_CHECKS)
