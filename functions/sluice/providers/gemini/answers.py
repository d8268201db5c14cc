"""What validation reads of a generateContent request, the body a chat or Responses line is kept as
for Gemini (`translate`): the JSON it asks for (`responseMimeType`, and `responseSchema` read back
as the JSON Schema it says), and the turns a repair adds (`contents`, roles `model` and `user`).
Its answers come back as chat completions or responses, which OpenAI's readers read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..reading import Asked
from .schema import json_schema
from .translate import JSON_MIME


def is_generate(body: Mapping[str, Any]) -> bool:
    """Whether a kept body is a generateContent request rather than the line's own shape."""
    return "contents" in body and "messages" not in body and "input" not in body


def generate_asked(body: Mapping[str, Any]) -> Asked:
    config = body.get("generationConfig")
    if not isinstance(config, dict) or config.get("responseMimeType") != JSON_MIME:
        return Asked()
    schema = config.get("responseSchema")
    return Asked(json=True, schema=json_schema(schema) if isinstance(schema, dict) else None)


def generate_repair(body: dict[str, Any], answer: str, message: str) -> dict[str, Any]:
    contents = body.get("contents")
    turns = list(contents) if isinstance(contents, list) else []
    turns += [{"role": "model", "parts": [{"text": answer}]}, {"role": "user", "parts": [{"text": message}]}]
    return {**body, "contents": turns}
