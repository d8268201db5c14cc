"""One file, any provider: a line in OpenAI's chat-completions shape sent as a Messages request, and
its answer given back as a chat.completion, so switching a job to Anthropic changes no line of the
input and no reader of the results. A `/v1/responses` line goes as the chat line asking the same and
comes back as a response (`..openai.responses`). A `/v1/messages` line goes as it is and comes back native.

A request field Messages has no equivalent for (`n` above 1, `logprobs`, a `response_format`
other than text, tools, penalties, a `temperature` above Anthropic's 1) is refused with its name:
the line is an error at Plan, before anything is sent, rather than an answer to another question.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from .. import translation
from ..openai import responses
from ..openai.chat_fields import UNTRANSLATED
from ..translation import CONTENT_FILTER, LENGTH, STOP, TOOL_CALLS

MESSAGES: Final = "/v1/messages"
CHAT: Final = "/v1/chat/completions"
RESPONSES: Final = responses.RESPONSES
PATHS = frozenset({MESSAGES, CHAT, RESPONSES})
API: Final = "the Messages API"
# Messages requires a cap; a chat line may set none. The most every Claude model can produce
# since Claude 3 Haiku, so a line without one is not cut shorter than it would be elsewhere
DEFAULT_MAX_TOKENS = 4096
MAX_TEMPERATURE = 1.0
FINISH_REASONS: Mapping[str, str] = {
    "end_turn": STOP,
    "stop_sequence": STOP,
    "pause_turn": STOP,
    "max_tokens": LENGTH,
    "model_context_window_exceeded": LENGTH,
    "tool_use": TOOL_CALLS,
    "refusal": CONTENT_FILTER,
}
# fields that change nothing Messages answers: OpenAI's storage and routing
_DROPPED = frozenset({"store", "metadata", "service_tier", "stream_options", "parallel_tool_calls"})
# fields that ask for what Messages cannot give, each unless it holds its no-op value
_REFUSED: Mapping[str, tuple[Any, ...]] = {
    **UNTRANSLATED,
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
}
_REASONS = {"response_format": "structured output"}
_MAPPED = frozenset(
    {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "user"}
)
_refuse = translation.refusal(API)


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _text_blocks(content: Any, role: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return translation.parts_of(content, role, text=_text, image=_image, refuse=_refuse)


def _image(url: Any) -> dict[str, Any]:
    if not isinstance(url, str):
        raise _refuse("an image_url part", "its url is not a string")
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media_type, _, encoding = head.removeprefix("data:").partition(";")
        if encoding != "base64" or not data:
            raise _refuse("an image_url part", "a data URL that is not base64")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _system_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    blocks = _text_blocks(content, "system")
    texts = [b.get("text") for b in blocks if isinstance(b, dict)]
    if not all(isinstance(t, str) for t in texts):
        raise _refuse("a system message's image", "Messages takes text only as its system prompt")
    return "\n".join(t for t in texts if isinstance(t, str))


def to_messages(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The Messages body of a line's `body` sent to `path`: a chat or Responses body translated, a
    Messages body as it is. Raises `Unsupported` naming the first field Messages cannot honour."""
    if path == RESPONSES:
        body = responses.to_chat(body, API)
    elif path != CHAT:
        return body
    translation.check_fields(body, refused=_REFUSED, known=_MAPPED | _DROPPED, refuse=_refuse, reasons=_REASONS)
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for role, content in translation.messages_of(body, _refuse, "tool use"):
        if role == translation.SYSTEM:
            system.append(_system_text(content))
        else:
            turns.append({"role": role, "content": _text_blocks(content, role)})
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    wire: dict[str, Any] = {
        "model": body.get("model"),
        "max_tokens": cap if cap is not None else DEFAULT_MAX_TOKENS,
        "messages": turns,
    }
    if system:
        wire["system"] = "\n\n".join(system)
    temperature = body.get("temperature")
    if temperature is not None:
        if isinstance(temperature, (int, float)) and temperature > MAX_TEMPERATURE:
            raise _refuse("temperature", f"{temperature} is above Anthropic's {MAX_TEMPERATURE}")
        wire["temperature"] = temperature
    if body.get("top_p") is not None:
        wire["top_p"] = body["top_p"]
    stop = body.get("stop")
    if stop is not None:
        wire["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if body.get("user") is not None:
        wire["metadata"] = {"user_id": body["user"]}
    return wire


def finish_reason_of(body: Mapping[str, Any]) -> str | None:
    """The finish reason of a chat.completion's first choice, or the one a translated response was
    made from; None when it has none."""
    made_from = responses.finish_reason_of(body)
    if made_from is not None:
        return made_from
    choices = body.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    reason = first.get("finish_reason") if isinstance(first, dict) else None
    return reason if isinstance(reason, str) else None


def to_chat_completion(path: str, body: Any, created: int) -> Any:
    """A chat line's Messages answer as the chat.completion an OpenAI provider would have given
    (`created`: epoch seconds, which a Messages answer does not state); any other answer as it is."""
    if path != CHAT or not isinstance(body, dict) or not isinstance(body.get("content"), list):
        return body
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in body["content"]:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            function = {"name": block.get("name"), "arguments": orjson.dumps(block.get("input", {})).decode()}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
    reason = body.get("stop_reason")
    found = body.get("usage")
    usage: Mapping[str, Any] = found if isinstance(found, dict) else {}
    cached = translation.count(usage, "cache_read_input_tokens")
    prompt = translation.count(usage, "input_tokens") + translation.count(usage, "cache_creation_input_tokens") + cached
    return translation.chat_completion(
        answer_id=body.get("id"),
        created=created,
        model=body.get("model"),
        message=translation.assistant_message(texts, calls),
        finish_reason=translation.finish_reason(FINISH_REASONS, reason),
        prompt=prompt,
        completion=translation.count(usage, "output_tokens"),
        cached=cached,
    )


def to_line_shape(path: str, body: Any, created: int) -> Any:
    """A Messages answer in the shape of the line that asked it: a chat.completion for a chat line, a
    response for a Responses line, as it is for a Messages line (`created`: epoch seconds)."""
    if path == RESPONSES:
        return responses.to_response(to_chat_completion(CHAT, body, created))
    return to_chat_completion(path, body, created)
