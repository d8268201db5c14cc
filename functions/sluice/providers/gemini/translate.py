"""One file, any provider, on Gemini: a line in OpenAI's chat-completions shape sent as a
`generateContent` request, and its answer given back as a chat.completion; a `/v1/responses` line
sent as the chat line asking the same, and answered as a response (`..openai.responses`).

The system prompt goes as `systemInstruction`, the turns as `contents` (roles `user` and `model`),
an image given as a base64 data URL as `inlineData`, a JSON schema as `responseSchema` (`schema`),
the output cap, sampling and stop sequences into `generationConfig`. The body keeps the line's
`model` (the cache, the budget and the limits read it there); Gemini names the model in the URL,
so `route` moves it there when the request is sent.

A request field Gemini has no equivalent for (`n` above 1, `logprobs`, tools, an image by URL,
which Gemini does not fetch) is refused with its name: the line is an error at Plan, before
anything is sent, rather than an answer to another question.
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
from ..translation import CONTENT_FILTER, LENGTH, STOP
from .schema import response_schema

CHAT: Final = "/v1/chat/completions"
RESPONSES: Final = responses.RESPONSES
PATHS = frozenset({CHAT, RESPONSES})
API: Final = "Gemini's generateContent"
# where a kept body is sent, the model (quoted) in its middle
GENERATE_PREFIX: Final = "/v1beta/models/"
GENERATE_SUFFIX: Final = ":generateContent"
FINISH_REASONS: Mapping[str, str] = {
    "STOP": STOP,
    "MAX_TOKENS": LENGTH,
    "SAFETY": CONTENT_FILTER,
    "RECITATION": CONTENT_FILTER,
    "BLOCKLIST": CONTENT_FILTER,
    "PROHIBITED_CONTENT": CONTENT_FILTER,
    "SPII": CONTENT_FILTER,
    "IMAGE_SAFETY": CONTENT_FILTER,
}
JSON_MIME: Final = "application/json"
# Gemini's processing tier, as a line may name it itself (`service_tier`) and as the REST body carries
# it: the line's words that Gemini takes, and Gemini's names for them
TIER_FIELD: Final = "service_tier"
WIRE_TIERS: Mapping[str, str] = {"flex": "FLEX", "priority": "PRIORITY"}
_DEFAULT_TIERS: tuple[Any, ...] = (None, "auto", "default")
# fields that change nothing Gemini answers: OpenAI's storage and routing
_DROPPED = frozenset({"store", "metadata", "stream_options", "parallel_tool_calls", "user"})
# Gemini takes the penalties and the seed under its own names
_CONFIG_FIELDS = {
    "temperature": "temperature",
    "top_p": "topP",
    "presence_penalty": "presencePenalty",
    "frequency_penalty": "frequencyPenalty",
    "seed": "seed",
}
_REFUSED: Mapping[str, tuple[Any, ...]] = {
    **{k: v for k, v in UNTRANSLATED.items() if k not in _CONFIG_FIELDS},
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
}
_MAPPED = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "stop", "response_format", TIER_FIELD})
_MAX_STOP_SEQUENCES = 5
_refuse = translation.refusal(API)


def _image(url: Any) -> dict[str, Any]:
    if not isinstance(url, str) or not url.startswith("data:"):
        raise _refuse("an image_url part", "Gemini takes an image's bytes inline, not a URL for it to fetch")
    head, _, data = url.partition(",")
    mime, _, encoding = head.removeprefix("data:").partition(";")
    if encoding != "base64" or not data or not mime.startswith("image/"):
        raise _refuse("an image_url part", "a data URL that is not a base64 image")
    return {"inlineData": {"mimeType": mime, "data": data}}


def _text(text: str) -> dict[str, Any]:
    return {"text": text}


def _parts(content: Any, role: str) -> list[dict[str, Any]]:
    return translation.parts_of(content, role, text=_text, image=_image, refuse=_refuse)


def _format(value: Any) -> dict[str, Any]:
    if value in (None, {"type": "text"}):
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return {"responseMimeType": JSON_MIME}
    spec = value.get("json_schema") if kind == "json_schema" else None
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise _refuse("response_format", f"{orjson.dumps(value).decode()[:80]} asked for")
    return {"responseMimeType": JSON_MIME, "responseSchema": response_schema(spec["schema"])}


def _config(body: Mapping[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if cap is not None:
        config["maxOutputTokens"] = cap
    for field, name in _CONFIG_FIELDS.items():
        if body.get(field) is not None:
            config[name] = body[field]
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or len(stops) > _MAX_STOP_SEQUENCES:
            raise _refuse("stop", f"more than {_MAX_STOP_SEQUENCES} stop sequences")
        config["stopSequences"] = stops
    config.update(_format(body.get("response_format")))
    return config


def to_generate(body: Mapping[str, Any]) -> dict[str, Any]:
    """A chat body's generateContent body, with its `model`; raises `Unsupported` naming the first
    field Gemini cannot honour."""
    translation.check_fields(body, refused=_REFUSED, known=_MAPPED | _DROPPED | set(_CONFIG_FIELDS), refuse=_refuse)
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    for role, content in translation.messages_of(body, _refuse, "a tool-use turn"):
        if role == translation.SYSTEM:
            system += _parts(content, translation.SYSTEM)
        else:
            contents.append({"role": "model" if role == "assistant" else "user", "parts": _parts(content, role)})
    if not contents:
        raise Unsupported("messages: Gemini needs at least one user or assistant turn besides the system prompt")
    wire: dict[str, Any] = {"model": body.get("model"), "contents": contents}
    if system:
        if any("text" not in part for part in system):
            raise _refuse("a system message's image", "Gemini takes text only as its system instruction")
        wire["systemInstruction"] = {"parts": system}
    config = _config(body)
    if config:
        wire["generationConfig"] = config
    tier = body.get(TIER_FIELD)
    if isinstance(tier, str) and tier in WIRE_TIERS:
        wire[TIER_FIELD] = WIRE_TIERS[tier]
    elif tier not in _DEFAULT_TIERS:
        raise _refuse(TIER_FIELD, f"{tier!r} asked for")
    return wire


def to_wire(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The body kept for a line to `path`, naming the line's model, which Gemini's URL needs."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Unsupported("model: Gemini names the model in a request's URL, and the line names none")
    if path == RESPONSES:
        tier = body.get(TIER_FIELD)
        chat = responses.to_chat(body, API)
        return to_generate({**chat, TIER_FIELD: tier} if tier is not None else chat)
    return to_generate(body)


def model_path(model: str) -> str:
    """`models/{model}` as a URL's path names it: a model given as `models/x` is the same model."""
    return quote(model.removeprefix("models/"), safe="-._~")


def route(path: str, body: bytes | None) -> tuple[str, bytes | None]:
    """Where a kept body goes (its model in the URL) and the body sent, without its model."""
    wire = orjson.loads(body) if body else {}
    model = wire.pop("model", "")
    return f"{GENERATE_PREFIX}{model_path(str(model))}{GENERATE_SUFFIX}", orjson.dumps(wire)


def usage_counts(usage: Mapping[str, Any]) -> tuple[int, int, int]:
    """(input, output, cached input) tokens of Gemini's `usageMetadata`: the thinking it bills as output."""
    prompt = translation.count(usage, "promptTokenCount") + translation.count(usage, "toolUsePromptTokenCount")
    output = translation.count(usage, "candidatesTokenCount") + translation.count(usage, "thoughtsTokenCount")
    return prompt, output, translation.count(usage, "cachedContentTokenCount")


def _answer_text(candidate: Mapping[str, Any]) -> str:
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    # a thought part is the model's thinking summary, not its answer
    return "".join(
        p["text"]
        for p in (parts if isinstance(parts, list) else ())
        if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")
    )


def to_chat_completion(body: Any, created: int, model: Any, request_id: str | None, tier: str = "") -> Any:
    """A generateContent answer as the chat.completion an OpenAI provider would have given: the line's
    model where the answer names no `modelVersion`, and the tier it was served at (its
    `usageMetadata.serviceTier`, else `tier`, the one it was sent at), as OpenAI's answer names it.
    A body of another shape is given back as it is."""
    if not isinstance(body, dict) or not ("candidates" in body or "promptFeedback" in body):
        return body
    candidates = body.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict) else {}
    reason = first.get("finishReason")
    feedback = body.get("promptFeedback")
    blocked = isinstance(feedback, dict) and feedback.get("blockReason") and not first
    finish = CONTENT_FILTER if blocked else translation.finish_reason(FINISH_REASONS, reason)
    found = body.get("usageMetadata")
    usage = found if isinstance(found, dict) else {}
    prompt, completion, cached = usage_counts(usage)
    served = usage.get("serviceTier")
    if isinstance(served, str) and served:
        # the answer names the tier that served it: that, not the one asked for, is what is billed
        tier = "flex" if served.lower().removeprefix("service_tier_") == "flex" else ""
    version = body.get("modelVersion")
    answer_id = body.get("responseId") or request_id or f"chatcmpl-{uuid.uuid4().hex}"
    completion_body = translation.chat_completion(
        answer_id=answer_id,
        created=created,
        model=version if isinstance(version, str) and version else model,
        message=translation.assistant_message([_answer_text(first)], []),
        finish_reason=finish,
        prompt=prompt,
        completion=completion,
        cached=cached,
    )
    if tier:
        completion_body[TIER_FIELD] = tier
    return completion_body


def to_line_shape(path: str, body: Any, created: int, model: Any, request_id: str | None, tier: str = "") -> Any:
    """A generateContent answer in the shape of the line that asked it: a chat.completion for a chat
    line, a response for a Responses line."""
    chat = to_chat_completion(body, created, model, request_id, tier)
    if path == RESPONSES:
        response = responses.to_response(chat)
        if tier and isinstance(response, dict) and response is not chat:
            response[TIER_FIELD] = tier
        return response
    return chat
