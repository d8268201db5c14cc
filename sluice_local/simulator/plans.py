"""The answer to one inference request, planned before it is sent.

A plan knows its token counts up front (the limiter charges them before any fault is
drawn) and builds the OpenAI-shaped body only when the answer is actually given.
"""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice_local.simulator.answers import (
    answer_for,
    count_tokens,
    embedding_vector,
    limit_text,
    positive_int,
    responses_prompt,
    text_of,
)
from sluice_local.simulator.structured import Asked, Reply, json_text
from sluice_local.simulator.wire import FINGERPRINT, ApiError

BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions")

NewId = Callable[[str], str]

# the tier OpenAI's flex processing is asked for with, and answers that it served
FLEX = "flex"
# the tiers an answer names as the one that served it; any other ask ("auto", none) is the default
_SERVED_TIERS = frozenset({FLEX, "priority"})


def served_tier(data: Mapping[str, Any]) -> str:
    """The tier an OpenAI answer says served a request whose body is `data`."""
    asked = data.get("service_tier")
    return asked if isinstance(asked, str) and asked in _SERVED_TIERS else "default"


@dataclass(slots=True)
class Plan:
    prompt_tokens: int
    completion_tokens: int
    build: Callable[[], dict[str, Any]]
    # a text answer, which an output fault may still change before `build` (`structured.spoil`)
    reply: Reply | None = None
    # what the request asks for, for a dialect `structured.asked_format` does not read (None: it does)
    asked: Asked | None = None


def reply_to(path: str, data: Mapping[str, Any], prompt: str, limit: int | None) -> Reply:
    """The answer to `prompt`: JSON where the request asks for it, cut to `limit` tokens."""
    reply = answer_for(prompt)
    text = json_text(path, data, reply) or reply
    cut, truncated = limit_text(text, limit)
    return Reply(cut if truncated else text, truncated)


def plan_for(path: str, data: dict[str, Any], new_id: NewId, embedding_dims: int) -> Plan:
    """The plan for a request body sent to `path` (one of BATCH_ENDPOINTS); a 400 ApiError if unusable."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "you must provide a model parameter", param="model", code="missing_required_parameter")
    if data.get("stream"):
        raise ApiError(400, "The simulator does not support streaming.", param="stream", code="unsupported_parameter")
    if path == "/v1/chat/completions":
        return _chat(model, data, new_id)
    if path == "/v1/completions":
        return _completions(model, data, new_id)
    if path == "/v1/responses":
        return _responses(data, new_id)
    return _embeddings(model, data, embedding_dims)


def _chat(model: str, data: dict[str, Any], new_id: NewId) -> Plan:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array.", param="messages", code="invalid_value")
    prompt = "\n".join(text_of(m.get("content")) for m in messages if isinstance(m, dict))
    limit = positive_int(data.get("max_completion_tokens"))
    if limit is None:
        limit = positive_int(data.get("max_tokens"))
    reply = reply_to("/v1/chat/completions", data, prompt, limit)
    n = min(max(positive_int(data.get("n")) or 1, 1), 16)
    pt, ct = count_tokens(prompt), count_tokens(reply.text or "") * n

    def build() -> dict[str, Any]:
        choice_reason = "length" if reply.truncated else "stop"
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply.text,
            "refusal": reply.refusal,
            "annotations": [],
        }
        return {
            "id": new_id("chatcmpl-sim"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": i,
                    "message": dict(message),
                    "logprobs": None,
                    "finish_reason": choice_reason,
                }
                for i in range(n)
            ],
            "usage": {
                "prompt_tokens": pt,
                "completion_tokens": ct,
                "total_tokens": pt + ct,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
            "system_fingerprint": FINGERPRINT,
            "service_tier": served_tier(data),
        }

    return Plan(pt, ct, build, reply)


def _completions(model: str, data: dict[str, Any], new_id: NewId) -> Plan:
    raw = data.get("prompt")
    if isinstance(raw, str):
        prompts = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
        prompts = list(raw)
    elif isinstance(raw, list) and raw:
        prompts = [str(raw)]  # token arrays: hash their text form
    else:
        raise ApiError(400, "'prompt' is required.", param="prompt", code="missing_required_parameter")
    limit = positive_int(data.get("max_tokens"))
    limit = 16 if limit is None else limit  # the legacy endpoint's default
    answers = [limit_text(answer_for(p), limit) for p in prompts]
    pt = sum(count_tokens(p) for p in prompts)
    ct = sum(count_tokens(text) for text, _ in answers)

    def build() -> dict[str, Any]:
        return {
            "id": new_id("cmpl-sim"),
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"text": text, "index": i, "logprobs": None, "finish_reason": "length" if cut else "stop"}
                for i, (text, cut) in enumerate(answers)
            ],
            "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
            "system_fingerprint": FINGERPRINT,
        }

    return Plan(pt, ct, build)


def _responses(data: dict[str, Any], new_id: NewId) -> Plan:
    if "input" not in data:
        raise ApiError(400, "Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
    prompt = responses_prompt(data)
    reply = reply_to("/v1/responses", data, prompt, positive_int(data.get("max_output_tokens")))
    pt, ct = count_tokens(prompt), count_tokens(reply.text or "")

    def build() -> dict[str, Any]:
        status = "incomplete" if reply.truncated else "completed"
        return response_object(
            new_id("resp_sim"), int(time.time()), status, data, reply.text, pt, refusal=reply.refusal
        )

    return Plan(pt, ct, build, reply)


def _embeddings(model: str, data: dict[str, Any], embedding_dims: int) -> Plan:
    raw = data.get("input")
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(t, str) for t in raw):
        texts = list(raw)
    elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
        texts = [str(raw)]
    elif isinstance(raw, list) and raw and all(isinstance(t, list) for t in raw):
        texts = [str(t) for t in raw]
    else:
        raise ApiError(400, "'input' is required.", param="input", code="missing_required_parameter")
    dims = positive_int(data.get("dimensions")) or embedding_dims
    as_base64 = data.get("encoding_format") == "base64"
    pt = sum(max(1, count_tokens(t)) for t in texts)

    def build() -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for i, text in enumerate(texts):
            vec = embedding_vector(text, dims)
            value: Any = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode() if as_base64 else vec
            items.append({"object": "embedding", "index": i, "embedding": value})
        return {"object": "list", "data": items, "model": model, "usage": {"prompt_tokens": pt, "total_tokens": pt}}

    return Plan(pt, 0, build)


def response_object(
    resp_id: str,
    created_at: int,
    status: str,
    data: Mapping[str, Any],
    text: str | None,
    input_tokens: int,
    *,
    error: dict[str, Any] | None = None,
    completed_at: int | None = None,
    refusal: str | None = None,
) -> dict[str, Any]:
    """A Responses API `response` object in `status`, with `text` (or a `refusal`) as its output
    when there is one."""
    output: list[dict[str, Any]] = []
    usage: dict[str, Any] | None = None
    if text is not None or refusal is not None:
        content: dict[str, Any] = (
            {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            if text is not None
            else {"type": "refusal", "refusal": refusal}
        )
        output.append(
            {
                "type": "message",
                "id": "msg_" + resp_id.removeprefix("resp_"),
                "status": "completed" if status == "completed" else "incomplete",
                "role": "assistant",
                "content": [content],
            }
        )
        ot = count_tokens(text or "")
        usage = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": ot,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + ot,
        }
    terminal = status in ("completed", "incomplete", "failed", "cancelled")
    metadata = data.get("metadata")
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": bool(data.get("background")),
        "completed_at": completed_at if completed_at is not None else (created_at if terminal else None),
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": data.get("instructions"),
        "max_output_tokens": data.get("max_output_tokens"),
        "metadata": metadata if isinstance(metadata, dict) else {},
        "model": data.get("model"),
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": served_tier(data),
        "store": True,
        "temperature": data.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": data.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "user": None,
    }
