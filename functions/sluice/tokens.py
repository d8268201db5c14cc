"""What a request counts against a tokens-per-minute limit, and what its answer says it took.

A request's token cost is what OpenAI counts against TPM when it admits one: the input's
characters / 4 plus the most output it may produce (`max_tokens` and its kin, times `n`), as in
OpenAI's cookbook (`api_request_parallel_processor.py`). The answer's `usage` settles it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

from .model import Request

# OpenAI estimates a request's input tokens from its characters, about 4 a token
CHARS_PER_TOKEN = 4
# the output a request that sets no limit on it is assumed to ask for, until its answer settles it.
# Smaller than the budget's reservation on purpose: this one only paces, and a guess too large
# would hold every shard below the quota it could use
DEFAULT_OUTPUT_TOKENS = 256
# the request body's fields that hold its input text, by endpoint
_INPUT_FIELDS = ("messages", "input", "prompt", "instructions")
_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for v in value.values())
    return 0


def estimate_tokens(body: Mapping[str, Any], path: str = "") -> int:
    """What a request counts against a TPM limit when it is admitted: its input's characters / 4
    plus the most output it may produce, times `n` (an embedding produces none)."""
    chars = sum(_text_chars(body.get(name)) for name in _INPUT_FIELDS)
    tokens = math.ceil(chars / CHARS_PER_TOKEN)
    if path.endswith("/embeddings"):
        return tokens
    limit = next((body[name] for name in _OUTPUT_LIMITS if isinstance(body.get(name), int)), None)
    output = limit if isinstance(limit, int) and limit > 0 else DEFAULT_OUTPUT_TOKENS
    n = body.get("n")
    return tokens + output * (n if isinstance(n, int) and n > 0 else 1)


def used_tokens(body: Any) -> int | None:
    """The tokens an answer's `usage` says it took, or None when it does not say."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")]
    counted = [p for p in parts if isinstance(p, int)]
    return sum(counted) if counted else None


def parsed_body(req: Request) -> dict[str, Any] | None:
    if req.body:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError:
            return None
        if isinstance(body, dict):
            return body
    return None


def request_model(req: Request) -> str:
    body = parsed_body(req)
    if body is not None and isinstance(body.get("model"), str):
        return str(body["model"])
    return ""
