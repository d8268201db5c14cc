"""OpenAI's request format, which every OpenAI-compatible provider (vLLM, sference, KiosAPI, ...)
speaks: Bearer auth, paths under `/v1`, `usage` in either spelling (Chat Completions' `prompt_tokens`
and `completion_tokens`, the Responses API's `input_tokens` and `output_tokens`), errors as
`{"error": {"code", "message"}}`, and the `x-ratelimit-*` headers.

A request's token cost is what OpenAI counts against TPM when it admits one: the input's characters
/ 4 plus the most output it may produce (`max_tokens` and its kin, times `n`), as in OpenAI's
cookbook (`api_request_parallel_processor.py`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from ...contract.model import FLEX, ServiceTier
from ..format import COMPLETE, CUT_SHORT, UNFINISHED, Finish, ProviderError, RateKind, RateLimits, Usage, is_count

NAME: Final = "openai"
# the endpoints a line may name: those of OpenAI's Batch API
PATHS = frozenset({"/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions"})
# OpenAI estimates a request's input tokens from its characters, about 4 a token
CHARS_PER_TOKEN = 4
# the request body's fields that hold its input text, by endpoint
_INPUT_FIELDS = ("messages", "input", "prompt", "instructions")
# the request body's caps on its output, newest spelling first: a body that sets two means the first
_OUTPUT_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_EMBEDDINGS = "/embeddings"
# the endpoints that take a processing tier (`service_tier`): flex serves these, not embeddings
_TIERED_PATHS = frozenset({"/v1/chat/completions", "/v1/responses"})
_TIER = "service_tier"
# the tier's member put first in an encoded body, whose other members follow unchanged
_TIER_MEMBERS = {FLEX: b'{"service_tier":"flex"'}
# flex's answer when it has no capacity now: a 429 of its own, not the key's rate limit
_TIER_UNAVAILABLE = "resource_unavailable"
# the statuses of a request refused for its tier: the model does not take it ("Unsupported
# service_tier: flex", "Flex is not available for this model")
_TIER_REFUSED_STATUSES = frozenset({400, 404})
# Body error codes that mean "the provider is congested" (OpenAI's and those of the servers that speak
# its format): retried like a 429 (and counted as throttling) whatever status the provider sent them with
CONGESTION_CODES = frozenset(
    {
        "queue_wait_exceeded",
        "max_queue_wait_exceeded",
        "rate_limit_exceeded",
        "server_overloaded",
        "overloaded",
    }
)
_LIMIT: dict[str, str] = {"requests": "x-ratelimit-limit-requests", "tokens": "x-ratelimit-limit-tokens"}
_LEFT: dict[str, str] = {"requests": "x-ratelimit-remaining-requests", "tokens": "x-ratelimit-remaining-tokens"}
_RESET: dict[str, str] = {"requests": "x-ratelimit-reset-requests", "tokens": "x-ratelimit-reset-tokens"}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def join_url(base_url: str, path: str) -> str:
    """Where the openai SDK sends `path` (a line's `/v1/...` url): its base URL holds the version, so
    the path goes after it without one. A base URL without /v1 then reaches a path the provider does
    not serve, as it would through the SDK and the Batch API, and shows up at the first request."""
    base = base_url.rstrip("/")
    if not path.startswith("/"):
        path = "/" + path
    if path == "/v1" or path.startswith("/v1/"):
        path = path[3:]
    return base + path


def parse_reset_s(text: str) -> float | None:
    """OpenAI's reset durations: "1s", "6m0s", "20ms", "1h2m3.5s", or bare seconds."""
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if math.isfinite(value) and value >= 0 else None
    total = 0.0
    end = 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != end:
            return None
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        end = match.end()
    return total if end == len(text) and end > 0 else None


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for v in value.values())
    return 0


def _per_second(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        per_minute = float(raw)
    except ValueError:
        return None
    return per_minute / 60.0 if math.isfinite(per_minute) and per_minute > 0 else None


def _first(usage: Mapping[str, Any], name: str, other: str) -> Any:
    """`usage[name]` if it is there (whatever it holds), else `usage[other]`."""
    return usage[name] if name in usage else usage.get(other)


class OpenAIFormat:
    """OpenAI's `RequestFormat`."""

    __slots__ = ()

    name = NAME
    throttle_statuses = frozenset({429})
    congestion_codes = CONGESTION_CODES
    model_in_url = False
    paths = PATHS

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}

    def url(self, base_url: str, path: str) -> str:
        return join_url(base_url, path)

    def route(self, path: str, body: bytes | None) -> tuple[str, bytes | None]:
        return path, body

    def model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) else ""

    def output_cap(self, body: Mapping[str, Any], path: str, *, default: int) -> int:
        if path.endswith(_EMBEDDINGS):
            return 0
        cap = default
        for name in _OUTPUT_CAPS:
            value = body.get(name)
            if is_count(value):
                cap = value
                break
        n = body.get("n")
        return cap * (n if is_count(n) else 1)

    def estimate_tokens(self, body: Mapping[str, Any], path: str, *, default_output: int) -> int:
        chars = sum(_text_chars(body.get(name)) for name in _INPUT_FIELDS)
        return math.ceil(chars / CHARS_PER_TOKEN) + self.output_cap(body, path, default=default_output)

    def usage(self, body: Any) -> Usage | None:
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return None
        tokens_in = _first(usage, "prompt_tokens", "input_tokens")
        if not isinstance(tokens_in, int):
            return None
        tokens_out = _first(usage, "completion_tokens", "output_tokens")
        # Chat Completions' prompt_tokens_details, the Responses API's input_tokens_details
        details = _first(usage, "prompt_tokens_details", "input_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return Usage(
            tokens_in,
            tokens_out if isinstance(tokens_out, int) else 0,
            cached_in=min(cached, tokens_in) if isinstance(cached, int) and cached > 0 else 0,
        )

    def counted_tokens(self, body: Any) -> int | None:
        # OpenAI counts input and output against TPM: the total, else the parts the body states
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return None
        total = usage.get("total_tokens")
        if isinstance(total, int):
            return total
        parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")]
        counted = [p for p in parts if isinstance(p, int)]
        return sum(counted) if counted else None

    def answered_model(self, body: Any) -> str | None:
        model = body.get("model") if isinstance(body, dict) else None
        return model if isinstance(model, str) else None

    def finish(self, body: Mapping[str, Any]) -> Finish:
        # a response says its status; a completion, each choice's finish reason
        status = body.get("status")
        if status is not None and status != "completed":
            return CUT_SHORT if status == "incomplete" else UNFINISHED
        choices = body.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict) and choice.get("finish_reason") == "length":
                    return CUT_SHORT
        return COMPLETE

    def request_id(self, headers: Mapping[str, str] | None, body: Any) -> str | None:
        request_id = headers.get("x-request-id") if headers is not None else None
        if request_id is None and isinstance(body, dict):
            rid = body.get("id")
            request_id = rid if isinstance(rid, str) else None
        return request_id

    def error(self, body: Any, headers: Mapping[str, str] | None = None) -> ProviderError:
        if not isinstance(body, dict):
            return ProviderError()
        error = body.get("error")
        if isinstance(error, dict):
            code = error.get("code") or error.get("type")
            message = error.get("message")
            return ProviderError(str(code) if code else None, str(message) if message else None)
        if isinstance(error, str):
            return ProviderError(error)
        code = body.get("code")
        message = body.get("message") or body.get("detail")
        return ProviderError(str(code) if code else None, str(message) if message else None)

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimits:
        requests = _per_second(headers, _LIMIT["requests"])
        tokens = _per_second(headers, _LIMIT["tokens"])
        return RateLimits(requests, tokens) if requests is not None or tokens is not None else _NO_LIMITS

    def left(self, headers: Mapping[str, str], kind: RateKind) -> float | None:
        raw = headers.get(_LEFT[kind])
        if raw is None:
            return None
        try:
            return float(raw)
        except ValueError:
            return None

    def reset_s(self, headers: Mapping[str, str], kind: RateKind, now: float) -> float | None:
        raw = headers.get(_RESET[kind])
        return parse_reset_s(raw) if raw else None

    def to_wire(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def added_tier(self, path: str, body: Mapping[str, Any], tier: ServiceTier) -> ServiceTier:
        # a line that names its own tier asked for it: the job's tier does not overrule it
        return tier if tier and path in _TIERED_PATHS and _TIER not in body else ""

    def tiered(self, body: bytes, tier: ServiceTier) -> bytes:
        # spliced into the bytes already encoded: no second parse or encode on the hot path, and
        # `added_tier` saw that the body has no such member
        member = _TIER_MEMBERS[tier]
        rest = body[1:].lstrip()
        return member + (rest if rest.startswith(b"}") else b"," + rest)

    def batch_priced(self, body: Any) -> bool:
        # OpenAI's answer names the tier that served it; flex is billed at Batch API prices
        return isinstance(body, dict) and body.get(_TIER) == FLEX

    def tier_unavailable(self, status: int, body: Any) -> bool:
        return status == 429 and self.error(body).code == _TIER_UNAVAILABLE

    def tier_refused(self, status: int, body: Any) -> bool:
        if status not in _TIER_REFUSED_STATUSES:
            return False
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and error.get("param") == _TIER:
            return True
        message = (self.error(body).message or "").lower()
        return _TIER in message or FLEX in message

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
        return body


_NO_LIMITS = RateLimits()
OPENAI = OpenAIFormat()
