"""One file, any provider, on Amazon Bedrock: a line in OpenAI's chat-completions shape sent to the
Converse API, and its answer given back as a chat.completion; a `/v1/responses` line sent to Converse
as the chat line asking the same, and answered as a response (`..openai.responses`); a `/v1/messages` line
sent to InvokeModel as the Anthropic Messages body Bedrock takes, and answered natively.

Both bodies keep the line's `model` (the cache, the budget and the limits read it there); Bedrock
names the model in the URL instead, so `route` moves it there when the request is sent.

A request field Converse has no equivalent for (`n` above 1, `logprobs`, structured output,
penalties, tool-use turns) is refused with its name: the line is an error at Plan, before anything
is sent, rather than an answer to another question.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import orjson

from .. import translation
from ..format import Unsupported
from ..openai import responses
from ..openai.chat_fields import UNTRANSLATED
from ..translation import CONTENT_FILTER, LENGTH, STOP, TOOL_CALLS

CHAT: Final = "/v1/chat/completions"
MESSAGES: Final = "/v1/messages"
RESPONSES: Final = responses.RESPONSES
PATHS = frozenset({CHAT, MESSAGES, RESPONSES})
# the lines sent to Converse; any other goes to InvokeModel
_CONVERSE_PATHS = frozenset({CHAT, RESPONSES})
API: Final = "Bedrock's Converse API"
# InvokeModel's Anthropic bodies name the API version in the body, and no model
BEDROCK_ANTHROPIC_VERSION: Final = "bedrock-2023-05-31"
FINISH_REASONS: Mapping[str, str] = {
    "end_turn": STOP,
    "stop_sequence": STOP,
    "max_tokens": LENGTH,
    "tool_use": TOOL_CALLS,
    "content_filtered": CONTENT_FILTER,
    "guardrail_intervened": CONTENT_FILTER,
}
_IMAGE_FORMATS = frozenset({"png", "jpeg", "gif", "webp"})
# fields that change nothing Converse answers: OpenAI's storage and routing
_DROPPED = frozenset({"store", "metadata", "service_tier", "stream_options", "parallel_tool_calls", "user"})
# fields that ask for what Converse cannot give, each unless it holds its no-op value
_REFUSED: Mapping[str, tuple[Any, ...]] = {**UNTRANSLATED, "response_format": (None, {"type": "text"})}
_MAPPED = frozenset(
    {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "tools", "tool_choice"}
)
_refuse = translation.refusal(API)


def _image(url: Any) -> dict[str, Any]:
    if not isinstance(url, str) or not url.startswith("data:"):
        raise _refuse("an image_url part", "Converse takes an image's bytes, not its URL")
    head, _, data = url.partition(",")
    media_type, _, encoding = head.removeprefix("data:").partition(";")
    kind = media_type.removeprefix("image/")
    if encoding != "base64" or not data or kind not in _IMAGE_FORMATS:
        raise _refuse("an image_url part", "a data URL that is not a base64 png, jpeg, gif or webp")
    return {"image": {"format": kind, "source": {"bytes": data}}}


def _text(text: str) -> dict[str, Any]:
    return {"text": text}


def _blocks(content: Any, role: str) -> list[dict[str, Any]]:
    return translation.parts_of(content, role, text=_text, image=_image, refuse=_refuse)


def _tool_config(tools: Any, choice: Any) -> dict[str, Any] | None:
    if not tools:
        if choice not in (None, "none", "auto"):
            raise _refuse("tool_choice", "a choice of tools with no tools")
        return None
    specs: list[dict[str, Any]] = []
    for tool in tools if isinstance(tools, list) else [tools]:
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _refuse("tools", "only function tools translate")
        spec: dict[str, Any] = {"name": function["name"], "inputSchema": {"json": function.get("parameters") or {}}}
        if isinstance(function.get("description"), str):
            spec["description"] = function["description"]
        specs.append({"toolSpec": spec})
    config: dict[str, Any] = {"tools": specs}
    if choice == "required":
        config["toolChoice"] = {"any": {}}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        config["toolChoice"] = {"tool": {"name": choice["function"].get("name")}}
    elif choice not in (None, "auto"):
        raise _refuse("tool_choice", f"{orjson.dumps(choice).decode()[:80]} asked for")
    return config


def _inference_config(body: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if cap is not None:
        config["maxTokens"] = cap
    if body.get("temperature") is not None:
        config["temperature"] = body["temperature"]
    if body.get("top_p") is not None:
        config["topP"] = body["top_p"]
    stop = body.get("stop")
    if stop is not None:
        config["stopSequences"] = [stop] if isinstance(stop, str) else stop
    return config


def to_converse(body: Mapping[str, Any]) -> dict[str, Any]:
    """A chat body's Converse body, with its `model`; raises `Unsupported` naming the first field
    Converse cannot honour."""
    translation.check_fields(body, refused=_REFUSED, known=_MAPPED | _DROPPED, refuse=_refuse)
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for role, content in translation.messages_of(body, _refuse, "a tool-use turn"):
        if role == translation.SYSTEM:
            system += _blocks(content, translation.SYSTEM)
        else:
            turns.append({"role": role, "content": _blocks(content, role)})
    wire: dict[str, Any] = {"model": body.get("model"), "messages": turns}
    if system:
        if any("text" not in block for block in system):
            raise _refuse("a system message's image", "Converse takes text only as its system prompt")
        wire["system"] = system
    config = _inference_config(body)
    if config:
        wire["inferenceConfig"] = config
    tools = _tool_config(body.get("tools"), body.get("tool_choice"))
    if tools is not None:
        wire["toolConfig"] = tools
    return wire


def to_invoke(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages body as InvokeModel takes it for an Anthropic model: its API version in the body."""
    if body.get("stream"):
        raise Unsupported("stream: Sluice sends every request whole; InvokeModel answers it whole")
    return {**body, "anthropic_version": body.get("anthropic_version") or BEDROCK_ANTHROPIC_VERSION}


def to_wire(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body kept for a line to `path`: Converse's for a chat or Responses line, InvokeModel's for
    a Messages line, each naming the line's model, which Bedrock's URL needs."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Unsupported("model: Bedrock names the model in a request's URL, and the line names none")
    if path == RESPONSES:
        return to_converse(responses.to_chat(body, API))
    return to_converse(body) if path == CHAT else to_invoke(body)


def route(path: str, body: bytes | None) -> tuple[str, bytes | None]:
    """Where a kept body goes (Converse for a chat or Responses line, InvokeModel for a Messages line, the model
    in the URL, encoded as boto3 encodes it) and the body sent, without its model."""
    wire = orjson.loads(body) if body else {}
    model = wire.pop("model", "")
    action = "converse" if path in _CONVERSE_PATHS else "invoke"
    return f"/model/{quote(str(model), safe='')}/{action}", orjson.dumps(wire)


def to_chat_completion(body: Any, created: int, model: Any, request_id: str | None) -> Any:
    """A Converse answer as the chat.completion an OpenAI provider would have given: Converse names
    neither the model nor an id, so the line's model and the answer's request id stand in. A
    Converse-compatible server that sends no request id gets one made up: OpenAI's clients and SDK
    models require the id to be a string."""
    output = body.get("output") if isinstance(body, dict) else None
    message = output.get("message") if isinstance(output, dict) else None
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return body
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message["content"]:
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            function = {"name": use.get("name"), "arguments": orjson.dumps(use.get("input", {})).decode()}
            calls.append({"id": use.get("toolUseId"), "type": "function", "function": function})
    reason = body.get("stopReason")
    found = body.get("usage")
    usage: Mapping[str, Any] = found if isinstance(found, dict) else {}
    return translation.chat_completion(
        answer_id=request_id or f"chatcmpl-{uuid.uuid4().hex}",
        created=created,
        model=model,
        message=translation.assistant_message(texts, calls),
        finish_reason=translation.finish_reason(FINISH_REASONS, reason),
        prompt=translation.count(usage, "inputTokens"),
        completion=translation.count(usage, "outputTokens"),
    )


def to_line_shape(path: str, body: Any, created: int, model: Any, request_id: str | None) -> Any:
    """A Converse answer in the shape of the line that asked it: a chat.completion for a chat line, a
    response for a Responses line; an InvokeModel answer (a Messages line's) as it is."""
    if path == CHAT:
        return to_chat_completion(body, created, model, request_id)
    if path == RESPONSES:
        return responses.to_response(to_chat_completion(body, created, model, request_id))
    return body
