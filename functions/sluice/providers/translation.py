"""What every family that translates a chat-completions line does alike (Anthropic's Messages,
Bedrock's Converse, Gemini's generateContent): a field it cannot honour refused by name, the
line's messages read by role, a message's parts read as text or images, and its answer given back
as the chat.completion an OpenAI provider would have given. What each part, turn or answer looks
like on the wire stays in the family's own module."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Final

import orjson

from .format import Unsupported
from .openai.chat_fields import SYSTEM_ROLES, TURN_ROLES

# a family's refusal of a field: (what the line asked, why it cannot be sent)
Refuse = Callable[[str, str], Unsupported]
SYSTEM = "system"
# a chat.completion's finish reasons
STOP: Final = "stop"
LENGTH: Final = "length"
TOOL_CALLS: Final = "tool_calls"
CONTENT_FILTER: Final = "content_filter"
# a chat.completion's usage, which a translated answer's is read back from
PROMPT_TOKENS: Final = "prompt_tokens"
COMPLETION_TOKENS: Final = "completion_tokens"


def refusal(api: str) -> Refuse:
    """How `api` refuses a field it has no equivalent for."""

    def refuse(field: str, why: str) -> Unsupported:
        return Unsupported(f"{field}: {why}; {api} has no equivalent (send it to an OpenAI provider)")

    return refuse


def check_fields(
    body: Mapping[str, Any],
    *,
    refused: Mapping[str, tuple[Any, ...]],
    known: Collection[str],
    refuse: Refuse,
    reasons: Mapping[str, str] | None = None,
) -> None:
    """Refuse the first field of `body` that is in `refused` without one of its no-op values (why:
    its `reasons` entry, else what it asked for), or that is not `known`."""
    for field in body:
        if field in refused:
            if body[field] not in refused[field]:
                why = (reasons or {}).get(field) or f"{orjson.dumps(body[field]).decode()[:80]} asked for"
                raise refuse(field, why)
        elif field not in known:
            raise refuse(field, "an unknown field")


def messages_of(body: Mapping[str, Any], refuse: Refuse, tool_use: str) -> Iterator[tuple[str, Any]]:
    """Each message of a chat body as (`SYSTEM`, or its turn's role; its content); a tool-use turn
    is refused as `tool_use`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Unsupported("messages: a chat line needs a non-empty list of messages")
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role in SYSTEM_ROLES:
            yield SYSTEM, message.get("content")
        elif role in TURN_ROLES:
            if message.get("tool_calls"):
                raise refuse("an assistant message's tool_calls", tool_use)
            yield role, message.get("content")
        else:
            raise refuse(f"a message with role {role!r}", "only system, developer, user and assistant translate")


def parts_of(
    content: Any,
    role: str,
    *,
    text: Callable[[str], dict[str, Any]],
    image: Callable[[Any], dict[str, Any]],
    refuse: Refuse,
) -> list[dict[str, Any]]:
    """A message's content (a string, or text and image_url parts) as the family's parts: `text`
    makes a text part, `image` an image part from its URL."""
    if isinstance(content, str):
        return [text(content)]
    if not isinstance(content, list):
        raise refuse(f"a {role} message's content", "neither text nor a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(text(part["text"]))
        elif kind == "image_url" and isinstance(part.get("image_url"), dict):
            parts.append(image(part["image_url"].get("url")))
        else:
            raise refuse(f"a {role} message's {kind or 'untyped'} part", "not text or an image")
    return parts


def count(usage: Mapping[str, Any], name: str) -> int:
    """A token count of an answer's usage; 0 where it is missing or not a count."""
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def finish_reason(reasons: Mapping[str, str], reason: Any) -> str:
    """The chat.completion's finish reason for the family's `reason`, by its `reasons`: `STOP`
    for one it does not name."""
    return reasons.get(reason, STOP) if isinstance(reason, str) else STOP


def assistant_message(texts: list[str], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat.completion's message: its text, and the tool calls it made."""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    message["refusal"] = None
    if calls:
        message["tool_calls"] = calls
    return message


def chat_completion(
    *,
    answer_id: Any,
    created: int,
    model: Any,
    message: dict[str, Any],
    finish_reason: str,
    prompt: int,
    completion: int,
    cached: int | None = None,
) -> dict[str, Any]:
    """A translated answer as a chat.completion of one choice; its usage states the cached input
    tokens when the family counts them (`cached`)."""
    usage: dict[str, Any] = {
        PROMPT_TOKENS: prompt,
        COMPLETION_TOKENS: completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {
        "id": answer_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
    }
