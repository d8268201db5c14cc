"""One file, any provider, for lines in OpenAI's Responses shape (`/v1/responses`): a family that
translates chat-completions lines (Anthropic's Messages, Bedrock's Converse) takes a Responses body
as the chat body that asks the same (`to_chat`) and gives its chat.completion back as the response
an OpenAI provider would have given (`to_response`), so each family keeps one translation.

What only a stored or stateful response can do (`previous_response_id`, `conversation`,
`background`), tools, reasoning, structured output and image or file inputs are refused with the
field's name: the line is an error at Plan, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from ..format import Unsupported

RESPONSES: Final = "/v1/responses"
# the chat finish reasons a response ends `incomplete` on, and the reason it gives
_INCOMPLETE: Mapping[str, str] = {"length": "max_output_tokens", "content_filter": "content_filter"}
_FINISH_REASONS: Mapping[str, str] = {reason: finish for finish, reason in _INCOMPLETE.items()}
_ROLES = frozenset({"user", "assistant", "system", "developer"})
_TEXT_PARTS = frozenset({"input_text", "output_text"})
# fields that change nothing the answer says: OpenAI's storage, routing and caching
_DROPPED = frozenset(
    {
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "parallel_tool_calls",
        "stream_options",
    }
)
# fields that ask for what a chat translation cannot give, each unless it holds its no-op value
_REFUSED: Mapping[str, tuple[Any, ...]] = {
    "background": (None, False),
    "previous_response_id": (None,),
    "conversation": (None,),
    "prompt": (None,),
    "include": (None, []),
    "reasoning": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "max_tool_calls": (None,),
    "top_logprobs": (None, 0),
    "stream": (None, False),
    "truncation": (None, "disabled"),
}
_TEXT_FORMATS: tuple[Any, ...] = (None, {}, {"format": {"type": "text"}})
# the chat fields that carry over under the same name
_KEPT = ("model", "temperature", "top_p", "user")


def _refuse(field: str, why: str, api: str) -> Unsupported:
    return Unsupported(f"{field}: {why}; {api} has no equivalent (send it to an OpenAI provider)")


def _content(content: Any, where: str, api: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse(f"{where}.content", "neither text nor a list of parts", api)
    parts: list[dict[str, Any]] = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise _refuse(f"{where}.content[{n}]", f"an {kind or 'untyped'} part, not text", api)
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _messages(given: Any, api: str) -> list[dict[str, Any]]:
    if isinstance(given, str) and given:
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise Unsupported("input: a Responses line needs text or a non-empty list of messages")
    messages: list[dict[str, Any]] = []
    for n, item in enumerate(given):
        where = f"input[{n}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind != "message":
            raise _refuse(where, f"a {kind or 'untyped'} item, not a message", api)
        role = item.get("role")
        if role not in _ROLES:
            raise _refuse(where, f"a message with role {role!r}", api)
        messages.append({"role": role, "content": _content(item.get("content"), where, api)})
    return messages


def to_chat(body: Mapping[str, Any], api: str) -> dict[str, Any]:
    """The chat body asking what a Responses `body` asks; raises `Unsupported` naming the first
    field the chat translation to `api` (its name, for the message) cannot honour."""
    for field, value in body.items():
        if field in _REFUSED:
            if value not in _REFUSED[field]:
                raise _refuse(field, f"{orjson.dumps(value).decode()[:80]} asked for", api)
        elif field == "text":
            if value not in _TEXT_FORMATS:
                raise _refuse("text", f"{orjson.dumps(value).decode()[:80]}: only plain text output translates", api)
        elif (
            field not in _KEPT and field not in _DROPPED and field not in ("input", "instructions", "max_output_tokens")
        ):
            raise _refuse(field, "an unknown field", api)
    messages = _messages(body.get("input"), api)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _refuse("instructions", "not text", api)
        messages.insert(0, {"role": "system", "content": instructions})
    chat: dict[str, Any] = {field: body[field] for field in _KEPT if body.get(field) is not None}
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    return chat


def _count(usage: Mapping[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def to_response(chat: Any) -> Any:
    """A chat.completion as the response an OpenAI provider would have given (a chat answer cut at
    its cap, or filtered, is an `incomplete` response saying why); any other body as it is."""
    choices = chat.get("choices") if isinstance(chat, dict) and chat.get("object") == "chat.completion" else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if choice is None:
        return chat
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else None
    reason = _INCOMPLETE.get(str(choice.get("finish_reason")))
    status = "incomplete" if reason else "completed"
    found = chat.get("usage")
    usage: Mapping[str, Any] = found if isinstance(found, dict) else {}
    details = usage.get("prompt_tokens_details")
    tokens_in, tokens_out = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
    return {
        "id": chat.get("id"),
        "object": "response",
        "created_at": chat.get("created"),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": reason} if reason else None,
        "model": chat.get("model"),
        "output": [
            {
                "type": "message",
                "id": chat.get("id"),
                "status": status,
                "role": "assistant",
                "content": [{"type": "output_text", "text": text if isinstance(text, str) else "", "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": tokens_in,
            "input_tokens_details": {
                "cached_tokens": _count(details, "cached_tokens") if isinstance(details, dict) else 0
            },
            "output_tokens": tokens_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": tokens_in + tokens_out,
        },
    }


def finish_reason_of(body: Mapping[str, Any]) -> str | None:
    """The chat finish reason a response made by `to_response` was made from; None for another body."""
    if body.get("object") != "response":
        return None
    if body.get("status") == "completed":
        return "stop"
    details = body.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    return _FINISH_REASONS.get(str(reason), "length")
