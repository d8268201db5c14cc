"""Anthropic's request format, the Messages API: `x-api-key` and `anthropic-version` headers, one
path (`/v1/messages`), `max_tokens` required in every body, `usage` as `input_tokens` and
`output_tokens`, `stop_reason`, errors as `{"type": "error", "error": {"type", "message"}}`, the
`request-id` header, and the `anthropic-ratelimit-*` headers, whose resets are RFC 3339 times.

Anthropic limits a key's input and output tokens a minute apart (ITPM, OTPM); the core's one
tokens limit is the input one, which is what Anthropic counts when it admits a request (the output
is counted as it is produced), so a request's estimate is its input alone.

An answer reaches the core native (a `/v1/messages` line), translated to a chat.completion (a chat
line, `translate`) or to a response (a Responses line): every method reading an answer's body reads
all three.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from ...contract.model import ServiceTier
from ..format import (
    COMPLETE,
    CUT_SHORT,
    RATE_KINDS,
    Finish,
    NoServiceTiers,
    ProviderError,
    RateKind,
    RateLimits,
    Usage,
    is_count,
)
from ..translation import COMPLETION_TOKENS, LENGTH, PROMPT_TOKENS
from . import translate

NAME: Final = "anthropic"
API_VERSION: Final = "2023-06-01"
MESSAGES: Final = translate.MESSAGES
CHARS_PER_TOKEN = 4
# 529: Anthropic is overloaded for everyone; retried and backed off from like a 429
OVERLOADED_STATUS: Final = 529
CONGESTION_CODES = frozenset({"overloaded_error", "rate_limit_error"})
_PREFIX = "anthropic-ratelimit-"
# the core's tokens limit is the input one; `tokens-*` (the tighter of input and output) where a
# server states no input limit of its own
_KIND_HEADERS: dict[str, tuple[str, ...]] = {
    "requests": ("requests",),
    "tokens": ("input-tokens", "tokens"),
}
_INPUT_PARTS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
_CUT_SHORT = frozenset({"max_tokens", "model_context_window_exceeded", "pause_turn"})


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for v in value.values())
    return 0


def _header(headers: Mapping[str, str], kind: RateKind, what: str) -> str | None:
    for name in _KIND_HEADERS[kind]:
        raw = headers.get(f"{_PREFIX}{name}-{what}")
        if raw is not None:
            return raw
    return None


def _float(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_reset(text: str, now: float) -> float | None:
    """Seconds from `now` (epoch seconds) to an RFC 3339 time such as "2026-01-01T00:00:05Z"; 0 for
    a time already past; None for text that is no such time."""
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if at.tzinfo is None:
        return None
    return max(0.0, at.timestamp() - now)


def _usage_of(body: Any) -> Mapping[str, Any] | None:
    usage = body.get("usage") if isinstance(body, dict) else None
    return usage if isinstance(usage, dict) else None


class AnthropicFormat(NoServiceTiers):
    """Anthropic's `RequestFormat`."""

    __slots__ = ()

    name = NAME
    throttle_statuses = frozenset({429, OVERLOADED_STATUS})
    congestion_codes = CONGESTION_CODES
    model_in_url = False
    paths = translate.PATHS

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key, "anthropic-version": API_VERSION}

    def url(self, base_url: str, path: str) -> str:
        # every line goes to the one endpoint: a chat line is translated to a Messages body
        base = base_url.rstrip("/")
        return base + (MESSAGES.removeprefix("/v1") if base.endswith("/v1") else MESSAGES)

    def route(self, path: str, body: bytes | None) -> tuple[str, bytes | None]:
        return path, body

    def model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) else ""

    def output_cap(self, body: Mapping[str, Any], path: str, *, default: int) -> int:
        cap = body.get("max_tokens")
        return cap if is_count(cap) else default

    def estimate_tokens(self, body: Mapping[str, Any], path: str, *, default_output: int) -> int:
        chars = _text_chars(body.get("system")) + _text_chars(body.get("messages"))
        return math.ceil(chars / CHARS_PER_TOKEN)

    def usage(self, body: Any) -> Usage | None:
        usage = _usage_of(body)
        if usage is None:
            return None
        if "input_tokens" in usage:
            if not isinstance(usage["input_tokens"], int):
                return None
            details = usage.get("input_tokens_details")
            if isinstance(details, dict):
                # a Responses answer translated from Messages: its input_tokens holds the cache
                # already and its details the reads; like a chat answer, it keeps no cache writes
                tokens = _number(usage["input_tokens"])
                cached = min(_number(details.get("cached_tokens")), tokens)
                return Usage(tokens, _number(usage.get("output_tokens")), cached_in=cached)
            # the whole input, as OpenAI's prompt_tokens counts it: cache writes and reads are input too
            tokens_in = sum(_number(usage.get(k)) for k in _INPUT_PARTS)
            return Usage(
                tokens_in,
                _number(usage.get("output_tokens")),
                cached_in=_number(usage.get("cache_read_input_tokens")),
                cache_write=_number(usage.get("cache_creation_input_tokens")),
            )
        prompt = usage.get(PROMPT_TOKENS)
        if not isinstance(prompt, int):
            return None
        # an answer translated to a chat.completion keeps its cache reads, not its cache writes
        details = usage.get("prompt_tokens_details")
        cached = _number(details.get("cached_tokens")) if isinstance(details, dict) else 0
        return Usage(prompt, _number(usage.get(COMPLETION_TOKENS)), cached_in=min(cached, prompt))

    def counted_tokens(self, body: Any) -> int | None:
        # ITPM counts the input not read from the prompt cache
        usage = _usage_of(body)
        if usage is None:
            return None
        if isinstance(usage.get("input_tokens"), int):
            return _number(usage["input_tokens"]) + _number(usage.get("cache_creation_input_tokens"))
        tokens_in = usage.get(PROMPT_TOKENS)
        return tokens_in if isinstance(tokens_in, int) else None

    def answered_model(self, body: Any) -> str | None:
        model = body.get("model") if isinstance(body, dict) else None
        return model if isinstance(model, str) else None

    def finish(self, body: Mapping[str, Any]) -> Finish:
        reason = body.get("stop_reason")
        if reason is None:
            reason = translate.finish_reason_of(body)
            return CUT_SHORT if reason == LENGTH else COMPLETE
        return CUT_SHORT if reason in _CUT_SHORT else COMPLETE

    def request_id(self, headers: Mapping[str, str] | None, body: Any) -> str | None:
        request_id = headers.get("request-id") if headers is not None else None
        if request_id is None and isinstance(body, dict):
            found = body.get("request_id", body.get("id"))
            request_id = found if isinstance(found, str) else None
        return request_id

    def error(self, body: Any, headers: Mapping[str, str] | None = None) -> ProviderError:
        if not isinstance(body, dict):
            return ProviderError()
        error = body.get("error")
        if isinstance(error, dict):
            code = error.get("type") or error.get("code")
            message = error.get("message")
            return ProviderError(str(code) if code else None, str(message) if message else None)
        if isinstance(error, str):
            return ProviderError(error)
        message = body.get("message")
        return ProviderError(None, str(message) if message else None)

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimits:
        per_s: list[float | None] = []
        for kind in RATE_KINDS:
            per_minute = _float(_header(headers, kind, "limit"))
            per_s.append(per_minute / 60.0 if per_minute is not None and per_minute > 0 else None)
        requests, tokens = per_s
        return RateLimits(requests, tokens) if requests is not None or tokens is not None else _NO_LIMITS

    def left(self, headers: Mapping[str, str], kind: RateKind) -> float | None:
        return _float(_header(headers, kind, "remaining"))

    def reset_s(self, headers: Mapping[str, str], kind: RateKind, now: float) -> float | None:
        raw = _header(headers, kind, "reset")
        return parse_reset(raw, now) if raw else None

    def to_wire(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return translate.to_messages(path, body)

    def from_wire(
        self,
        path: str,
        body: Any,
        created: int,
        *,
        sent: bytes | None = None,
        request_id: str | None = None,
        tier: ServiceTier = "",
    ) -> Any:
        return translate.to_line_shape(path, body, created)


_NO_LIMITS = RateLimits()
ANTHROPIC = AnthropicFormat()
