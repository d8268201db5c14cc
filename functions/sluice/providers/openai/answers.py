"""What validation reads of OpenAI's Chat Completions and Responses: the JSON a request asks for
(`response_format`, `text.format`) and what an answer holds (text, tool arguments, a refusal, a
finish at the output limit or by a content filter)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..reading import Answer, Asked

CHAT: Final = "/v1/chat/completions"
RESPONSES: Final = "/v1/responses"
_JSON_TYPES = frozenset({"json_object", "json_schema"})
_CUT_SHORT_REASONS = frozenset({"max_output_tokens", "max_tokens"})
_CONTENT_FILTER: Final = "content_filter"


def _asked(fmt: Any, schema_of: Any) -> Asked:
    if not isinstance(fmt, dict) or fmt.get("type") not in _JSON_TYPES:
        return Asked()
    schema = schema_of(fmt) if fmt.get("type") == "json_schema" else None
    return Asked(json=True, schema=schema if isinstance(schema, dict) else None)


def chat_asked(body: Mapping[str, Any]) -> Asked:
    def schema(fmt: dict[str, Any]) -> Any:
        spec = fmt.get("json_schema")
        return spec.get("schema") if isinstance(spec, dict) else None

    return _asked(body.get("response_format"), schema)


def responses_asked(body: Mapping[str, Any]) -> Asked:
    text = body.get("text")
    return _asked(text.get("format") if isinstance(text, dict) else None, lambda fmt: fmt.get("schema"))


def chat_answer(body: Any) -> Answer | None:
    choices = body.get("choices") if isinstance(body, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        return None
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    content = message.get("content")
    calls = message.get("tool_calls")
    arguments = tuple(
        call["function"]["arguments"]
        for call in (calls if isinstance(calls, list) else ())
        if isinstance(call, dict)
        and isinstance(call.get("function"), dict)
        and isinstance(call["function"].get("arguments"), str)
    )
    reason = choice.get("finish_reason")
    refusal = message.get("refusal")
    refused = refusal if isinstance(refusal, str) and refusal else None
    if refused is None and reason == _CONTENT_FILTER:
        refused = "the provider's content filter stopped the answer"
    return Answer(
        text=content if isinstance(content, str) else None,
        arguments=arguments,
        cut_short=reason == "length",
        refused=refused,
    )


def responses_answer(body: Any) -> Answer | None:
    output = body.get("output") if isinstance(body, dict) else None
    if not isinstance(output, list):
        return None
    texts: list[str] = []
    arguments: list[str] = []
    refused: str | None = None
    for item in output:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call" and isinstance(item.get("arguments"), str):
            arguments.append(item["arguments"])
        content = item.get("content") if item.get("type") == "message" else None
        for part in content if isinstance(content, list) else ():
            if not isinstance(part, dict):
                continue
            if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                refused = part["refusal"] or refused
    details = body.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    if refused is None and reason == _CONTENT_FILTER:
        refused = "the provider's content filter stopped the answer"
    return Answer(
        text="".join(texts) if texts else None,
        arguments=tuple(arguments),
        cut_short=body.get("status") == "incomplete" and reason in _CUT_SHORT_REASONS,
        refused=refused,
    )


def chat_repair(body: dict[str, Any], answer: str, message: str) -> dict[str, Any]:
    messages = body.get("messages")
    turns = list(messages) if isinstance(messages, list) else []
    turns += [{"role": "assistant", "content": answer}, {"role": "user", "content": message}]
    return {**body, "messages": turns}


def responses_repair(body: dict[str, Any], answer: str, message: str) -> dict[str, Any]:
    given = body.get("input")
    turns: list[Any] = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
    turns += [{"role": "assistant", "content": answer}, {"role": "user", "content": message}]
    return {**body, "input": turns}
