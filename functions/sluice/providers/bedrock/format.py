"""Amazon Bedrock's request format, direct: the Converse API for chat lines and InvokeModel for
Anthropic Messages lines (`converse`), each at `/model/{modelId}/...` on the runtime endpoint
(`auth.endpoint`), signed with the function's AWS credentials (`auth.signer`) rather than a key.

Answers name the model nowhere and their id only in the `x-amzn-RequestId` header; errors put their
type in the `x-amzn-ErrorType` header and a `{"message"}` body. Bedrock sends no rate-limit headers:
the limiter paces by the configured quota of each model (`rate_limits`). Bedrock reserves a request's
input plus its output cap against the tokens-a-minute quota when it admits it, and settles to what it
used, as OpenAI does.

An answer reaches the core native (InvokeModel's Messages answer), translated to a chat.completion
or a response, or (read back from elsewhere) as Converse wrote it: every method reading an answer
reads all four.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import orjson

from ...contract.model import ServiceTier
from ..format import (
    COMPLETE,
    CUT_SHORT,
    Finish,
    NoRateHeaders,
    NoServiceTiers,
    ProviderError,
    Usage,
    is_count,
)
from ..openai import responses
from . import converse

NAME: Final = "bedrock"
CHARS_PER_TOKEN = 4
ERROR_TYPE_HEADER: Final = "x-amzn-ErrorType"
REQUEST_ID_HEADER: Final = "x-amzn-RequestId"
# Bedrock's throttling (429) and unavailability (503) errors, by the type its header names: retried
# and backed off from. ModelNotReadyException is a 429 too, but says the model is loading, not that
# the account sends too much, so it is retried by its status alone and the limit is left as it is
CONGESTION_CODES = frozenset({"ThrottlingException", "ServiceUnavailableException"})
_CUT_SHORT = frozenset({"max_tokens", "length"})
# usage's spellings: InvokeModel's (Messages), the chat.completion's, Converse's
# (read from the prompt cache, written to it): Converse's names, then an Anthropic body's
_CACHE_NAMES = (
    ("cacheReadInputTokens", "cache_read_input_tokens"),
    ("cacheWriteInputTokens", "cache_creation_input_tokens"),
)
_USAGE_NAMES = (
    ("input_tokens", "output_tokens"),
    ("prompt_tokens", "completion_tokens"),
    ("inputTokens", "outputTokens"),
)


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for v in value.values())
    return 0


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        # aiohttp's headers ignore case; a plain dict does not
        lower = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lower), None)
    return value


def _cached(usage: Mapping[str, Any], names: tuple[str, ...]) -> int:
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and value > 0:
            return value
    return 0


class BedrockFormat(NoServiceTiers, NoRateHeaders):
    """Bedrock's `RequestFormat`."""

    __slots__ = ()

    name = NAME
    throttle_statuses: frozenset[int] = frozenset()
    congestion_codes = CONGESTION_CODES
    model_in_url = True
    paths = converse.PATHS

    def auth_headers(self, api_key: str) -> dict[str, str]:
        # each request is signed (`auth.signer`): there is no key to send
        return {}

    def url(self, base_url: str, path: str) -> str:
        return base_url.rstrip("/") + path

    def route(self, path: str, body: bytes | None) -> tuple[str, bytes | None]:
        return converse.route(path, body)

    def model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        return model if isinstance(model, str) else ""

    def output_cap(self, body: Mapping[str, Any], path: str, *, default: int) -> int:
        config = body.get("inferenceConfig")
        cap = config.get("maxTokens") if isinstance(config, dict) else body.get("max_tokens")
        return cap if is_count(cap) else default

    def estimate_tokens(self, body: Mapping[str, Any], path: str, *, default_output: int) -> int:
        chars = _text_chars(body.get("system")) + _text_chars(body.get("messages"))
        return math.ceil(chars / CHARS_PER_TOKEN) + self.output_cap(body, path, default=default_output)

    def usage(self, body: Any) -> Usage | None:
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return None
        for tokens_in, tokens_out in _USAGE_NAMES:
            if isinstance(usage.get(tokens_in), int):
                out = usage.get(tokens_out)
                # Converse's and the Anthropic body's input count leaves out the cache's reads and writes
                read, written = (_cached(usage, names) for names in _CACHE_NAMES)
                return Usage(
                    usage[tokens_in] + read + written,
                    out if isinstance(out, int) else 0,
                    cached_in=read,
                    cache_write=written,
                )
        return None

    def counted_tokens(self, body: Any) -> int | None:
        used = self.usage(body)
        return used.tokens_in + used.tokens_out if used is not None else None

    def answered_model(self, body: Any) -> str | None:
        model = body.get("model") if isinstance(body, dict) else None
        return model if isinstance(model, str) else None

    def finish(self, body: Mapping[str, Any]) -> Finish:
        reason = body.get("stop_reason", body.get("stopReason"))
        if reason is None:
            reason = responses.finish_reason_of(body)
        if reason is None:
            choices = body.get("choices")
            first = choices[0] if isinstance(choices, list) and choices else None
            reason = first.get("finish_reason") if isinstance(first, dict) else None
        return CUT_SHORT if reason in _CUT_SHORT else COMPLETE

    def request_id(self, headers: Mapping[str, str] | None, body: Any) -> str | None:
        request_id = _header(headers, REQUEST_ID_HEADER) if headers is not None else None
        if request_id is None and isinstance(body, dict):
            found = body.get("id")
            request_id = found if isinstance(found, str) else None
        return request_id

    def error(self, body: Any, headers: Mapping[str, str] | None = None) -> ProviderError:
        # the header reads "ThrottlingException:http://internal.amazon.com/coral/..." at times
        named = _header(headers, ERROR_TYPE_HEADER) if headers is not None else None
        code = named.split(":", 1)[0].strip() if named else None
        message = None
        if isinstance(body, dict):
            found = body.get("message", body.get("Message"))
            message = str(found) if found else None
            if code is None and isinstance(body.get("__type"), str):
                code = body["__type"].rsplit("#", 1)[-1]
        return ProviderError(code or None, message)

    def to_wire(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return converse.to_wire(path, body)

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
        if path == converse.MESSAGES:
            return body
        model = orjson.loads(sent).get("model") if sent else None
        return converse.to_line_shape(path, body, created, model, request_id)


BEDROCK = BedrockFormat()
