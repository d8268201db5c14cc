"""Gemini's request format, direct: `POST {base}/v1beta/models/{model}:generateContent` with the key
in `x-goog-api-key`, as Google's SDK sends it (`translate` makes the body, `route` its URL).

Answers state their usage in `usageMetadata` (thinking billed as output), their model in
`modelVersion` and their id in `responseId`. Errors are Google's `{"error": {"code", "message",
"status", "details"}}`: the `status` is the code the core reads (`RESOURCE_EXHAUSTED` is a 429,
`INVALID_ARGUMENT` a 400), and a `google.rpc.RetryInfo` detail's `retryDelay` is how long the
provider asked to be left alone. Gemini sends no rate-limit headers: the limiter paces by the
configured limits of each model and by the 429s. Its tokens-a-minute limit counts a request's input.

Gemini's flex tier (`service_tier: FLEX` in the body) is billed at Batch API prices; when it has no
capacity it answers 503 `UNAVAILABLE` (or a 429 naming flex's capacity rather than the key's quota),
and the request may go on at the standard tier, as on OpenAI.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from ...contract.model import FLEX, ServiceTier
from ..format import COMPLETE, CUT_SHORT, UNFINISHED, Finish, NoRateHeaders, ProviderError, Usage, is_count
from ..openai import responses
from . import translate

NAME: Final = "gemini"
CHARS_PER_TOKEN = 4
# what Gemini counts an inline image as (a 384 px or smaller image is 258 tokens; larger ones are
# tiled at 258 a tile, which a body's base64 does not say)
IMAGE_TOKENS = 258
RESOURCE_EXHAUSTED: Final = "RESOURCE_EXHAUSTED"
UNAVAILABLE: Final = "UNAVAILABLE"
INVALID_ARGUMENT: Final = "INVALID_ARGUMENT"
CONGESTION_CODES = frozenset({RESOURCE_EXHAUSTED})
RETRY_INFO: Final = "type.googleapis.com/google.rpc.RetryInfo"
_TIER_UNAVAILABLE_STATUS = 503
_TIER_REFUSED_STATUSES = frozenset({400, 404})
_CUT_SHORT = frozenset({"MAX_TOKENS", "length"})
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")
_VERSIONS = ("/v1beta", "/v1")


def _input_tokens(value: Any) -> float:
    """The tokens of a body's input: its text a token each 4 characters, an inline image a fixed count."""
    if isinstance(value, str):
        return len(value) / CHARS_PER_TOKEN
    if isinstance(value, list):
        return sum(_input_tokens(v) for v in value)
    if isinstance(value, dict):
        if "inlineData" in value:
            return IMAGE_TOKENS
        return sum(_input_tokens(v) for v in value.values())
    return 0


def parse_duration_s(text: Any) -> float | None:
    """Seconds of a protobuf Duration as JSON writes it ("48s", "0.5s"); None for anything else."""
    if not isinstance(text, str):
        return None
    found = _DURATION.match(text)
    if found is None:
        return None
    value = float(found.group(1))
    return value if math.isfinite(value) else None


def _error_of(body: Any) -> dict[str, Any] | None:
    # Google's front ends answer some errors as a list of one error object
    if isinstance(body, list) and body and isinstance(body[0], dict):
        body = body[0]
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else None


def retry_delay_s(error: Mapping[str, Any]) -> float | None:
    """The wait a Google error's `RetryInfo` detail asks for; None when it has none."""
    details = error.get("details")
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, dict) and detail.get("@type") == RETRY_INFO:
            return parse_duration_s(detail.get("retryDelay"))
    return None


def _config(body: Mapping[str, Any]) -> Mapping[str, Any]:
    config = body.get("generationConfig")
    return config if isinstance(config, dict) else {}


class GeminiFormat(NoRateHeaders):
    """Gemini's `RequestFormat`."""

    __slots__ = ()

    name = NAME
    throttle_statuses = frozenset({429})
    congestion_codes = CONGESTION_CODES
    model_in_url = True
    paths = translate.PATHS

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-goog-api-key": api_key}

    def url(self, base_url: str, path: str) -> str:
        # the API root, before the version (GOOGLE_GEMINI_BASE_URL); a root given with it is the same API
        base = base_url.rstrip("/")
        for version in _VERSIONS:
            if base.endswith(version):
                base = base.removesuffix(version)
                break
        return base + path

    def route(self, path: str, body: bytes | None) -> tuple[str, bytes | None]:
        return translate.route(path, body)

    def model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) else ""

    def output_cap(self, body: Mapping[str, Any], path: str, *, default: int) -> int:
        cap = _config(body).get("maxOutputTokens", body.get("max_tokens"))
        return cap if is_count(cap) else default

    def estimate_tokens(self, body: Mapping[str, Any], path: str, *, default_output: int) -> int:
        return math.ceil(_input_tokens(body.get("systemInstruction")) + _input_tokens(body.get("contents")))

    def usage(self, body: Any) -> Usage | None:
        if not isinstance(body, dict):
            return None
        native = body.get("usageMetadata")
        if isinstance(native, dict):
            tokens_in, tokens_out, _ = translate.usage_counts(native)
            return Usage(tokens_in, tokens_out)
        usage = body.get("usage")
        if not isinstance(usage, dict):
            return None
        given = usage.get("prompt_tokens", usage.get("input_tokens"))
        if not isinstance(given, int):
            return None
        out = usage.get("completion_tokens", usage.get("output_tokens"))
        return Usage(given, out if isinstance(out, int) else 0)

    def counted_tokens(self, body: Any) -> int | None:
        # the tokens-a-minute limit counts the input
        used = self.usage(body)
        return used.tokens_in if used is not None else None

    def answered_model(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return None
        model = body.get("modelVersion", body.get("model"))
        return model if isinstance(model, str) else None

    def finish(self, body: Mapping[str, Any]) -> Finish:
        candidates = body.get("candidates")
        if isinstance(candidates, list):
            first = candidates[0] if candidates and isinstance(candidates[0], dict) else {}
            return CUT_SHORT if first.get("finishReason") in _CUT_SHORT else COMPLETE
        reason = responses.finish_reason_of(body)
        if reason is None:
            if body.get("object") == "response" and body.get("status") not in (None, "completed", "incomplete"):
                return UNFINISHED
            choices = body.get("choices")
            choice = choices[0] if isinstance(choices, list) and choices else None
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
        return CUT_SHORT if reason in _CUT_SHORT else COMPLETE

    def request_id(self, headers: Mapping[str, str] | None, body: Any) -> str | None:
        if isinstance(body, dict):
            found = body.get("responseId", body.get("id"))
            if isinstance(found, str) and found:
                return found
        return None

    def error(self, body: Any, headers: Mapping[str, str] | None = None) -> ProviderError:
        error = _error_of(body)
        if error is None:
            message = body.get("message") if isinstance(body, dict) else None
            return ProviderError(None, str(message) if message else None)
        status = error.get("status")
        code = status if isinstance(status, str) and status else error.get("code")
        message = error.get("message")
        return ProviderError(
            str(code) if code else None, str(message) if message else None, retry_after_s=retry_delay_s(error)
        )

    def to_wire(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return translate.to_wire(path, body)

    def added_tier(self, path: str, body: Mapping[str, Any], tier: ServiceTier) -> ServiceTier:
        # a line that names its own tier asked for it: the job's tier does not overrule it
        return tier if tier and tier in translate.WIRE_TIERS and translate.TIER_FIELD not in body else ""

    def tiered(self, body: bytes, tier: ServiceTier) -> bytes:
        member = b'{"%s":"%s"' % (translate.TIER_FIELD.encode(), translate.WIRE_TIERS[tier].encode())
        rest = body[1:].lstrip()
        return member + (rest if rest.startswith(b"}") else b"," + rest)

    def batch_priced(self, body: Any) -> bool:
        # the translated answer names the tier it was served at, as OpenAI's does
        return isinstance(body, dict) and body.get(translate.TIER_FIELD) == FLEX

    def tier_unavailable(self, status: int, body: Any) -> bool:
        said = self.error(body)
        if status == _TIER_UNAVAILABLE_STATUS:
            return said.code in (UNAVAILABLE, None)
        # a 429 that names flex's capacity, not the key's quota (which says its quota and its wait)
        message = (said.message or "").lower()
        return status == 429 and said.retry_after_s is None and FLEX in message and "capacity" in message

    def tier_refused(self, status: int, body: Any) -> bool:
        if status not in _TIER_REFUSED_STATUSES:
            return False
        message = (self.error(body).message or "").lower()
        return translate.TIER_FIELD in message or "service tier" in message or FLEX in message

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
        sent_body = orjson.loads(sent) if sent else {}
        model = sent_body.get("model") if isinstance(sent_body, dict) else None
        if (
            not tier
            and isinstance(sent_body, dict)
            and sent_body.get(translate.TIER_FIELD) == translate.WIRE_TIERS[FLEX]
        ):
            # a line that named flex itself was served at it: Gemini answers a tier it lacks with an error
            tier = FLEX
        return translate.to_line_shape(path, body, created, model, request_id, tier)


GEMINI = GeminiFormat()
