"""Anthropic's dialect of the simulator: the Messages API (`POST /v1/messages`).

The same plan, limiter and faults as the OpenAI endpoints, in Anthropic's shapes: the key in
`x-api-key`, `max_tokens` required, a `message` answer with `stop_reason` and `usage` as
`input_tokens`/`output_tokens`, errors as `{"type": "error", "error": {"type", "message"}}`
with a `request-id` header, the `anthropic-ratelimit-*` headers whose resets are RFC 3339
times, and the congestion fault as 529 `overloaded_error`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from sluice_local.simulator.answers import count_tokens, positive_int, text_of
from sluice_local.simulator.limits import Level
from sluice_local.simulator.plans import NewId, Plan, reply_to
from sluice_local.simulator.prompt_cache import PromptCache
from sluice_local.simulator.wire import ApiError

MESSAGES_PATH = "/v1/messages"
API_KEY_HEADER = "x-api-key"
REQUEST_ID_HEADER = "request-id"
OVERLOADED = 529
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    OVERLOADED: "overloaded_error",
}


def speaks(request: web.Request) -> bool:
    """Whether a request is in Anthropic's dialect: the Messages path and those under it (batches)."""
    return request.path == MESSAGES_PATH or request.path.startswith(MESSAGES_PATH + "/")


def plan_messages(data: dict[str, Any], new_id: NewId, cache: PromptCache | None = None) -> Plan:
    """The plan for a Messages request body; a 400 ApiError if Anthropic would refuse it. With a
    `cache`, the system prompt up to its last block marked `cache_control` is written to it the
    first time and read from it after, and the usage says so as Anthropic's does."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model: Field required")
    limit = positive_int(data.get("max_tokens"))
    if limit is None:
        raise ApiError(400, "max_tokens: Field required")
    if data.get("stream"):
        raise ApiError(400, "The simulator does not support streaming.")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages: at least one message is required")
    system = data.get("system")
    parts = [text_of(system)] if system else []
    parts += [text_of(m.get("content")) for m in messages if isinstance(m, dict)]
    prompt = "\n".join(parts)
    reply = reply_to(MESSAGES_PATH, data, prompt, limit)
    pt, ct = count_tokens(prompt), count_tokens(reply.text or "")
    read, written = cache.use(model, system) if cache is not None else (0, 0)

    def build() -> dict[str, Any]:
        content = [{"type": "text", "text": reply.text}] if reply.text is not None else []
        stop = "refusal" if reply.refusal is not None else "max_tokens" if reply.truncated else "end_turn"
        return {
            "id": new_id("msg_sim"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": pt - read - written,
                "output_tokens": ct,
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read,
            },
        }

    return Plan(pt, ct, build, reply)


def error_response(err: ApiError, request_id: str) -> web.Response:
    """An error answer as Anthropic writes it, whatever part raised it."""
    error = err.body.get("error")
    message = error.get("message") if isinstance(error, dict) else str(err)
    kind = _ERROR_TYPES.get(err.status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
    return web.Response(
        body=orjson.dumps(body), status=err.status, headers=err.headers, content_type="application/json"
    )


def _rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ratelimit_headers(levels: Mapping[str, Level], now: float | None = None) -> dict[str, str]:
    """`anthropic-ratelimit-*` from the limiter's levels: the simulator's one token bucket is
    stated as the input tokens and as the tokens (the tighter of input and output)."""
    wall = time.time() if now is None else now
    headers: dict[str, str] = {}
    for kind, names in (("requests", ("requests",)), ("tokens", ("input-tokens", "tokens"))):
        level = levels[kind]
        for name in names:
            prefix = f"anthropic-ratelimit-{name}"
            headers[f"{prefix}-limit"] = str(level.limit)
            headers[f"{prefix}-remaining"] = str(level.remaining)
            headers[f"{prefix}-reset"] = _rfc3339(wall + level.reset_s)
    return headers
