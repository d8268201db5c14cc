"""What validation reads of Anthropic's Messages: the JSON a request asks for (structured outputs'
`output_format`, or `output_config.format`) and what an answer holds (text blocks, tool_use input,
a stop at `max_tokens` or a refusal)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..reading import Answer, Asked
from .translate import MESSAGES

__all__ = ["MESSAGES", "messages_answer", "messages_asked", "messages_repair"]

_CUT_SHORT = frozenset({"max_tokens", "model_context_window_exceeded"})


def messages_asked(body: Mapping[str, Any]) -> Asked:
    fmt = body.get("output_format")
    config = body.get("output_config")
    if fmt is None and isinstance(config, dict):
        fmt = config.get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return Asked()
    schema = fmt.get("schema")
    return Asked(json=True, schema=schema if isinstance(schema, dict) else None)


def messages_answer(body: Any) -> Answer | None:
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, list):
        return None
    texts = [
        b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    ]
    arguments = tuple(
        b["input"]
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(b.get("input"), dict)
    )
    reason = body.get("stop_reason")
    return Answer(
        text="".join(texts) if texts else None,
        arguments=arguments,
        cut_short=reason in _CUT_SHORT,
        refused="the model declined to answer (stop_reason refusal)" if reason == "refusal" else None,
    )


def messages_repair(body: dict[str, Any], answer: str, message: str) -> dict[str, Any]:
    messages = body.get("messages")
    turns = list(messages) if isinstance(messages, list) else []
    turns += [{"role": "assistant", "content": answer}, {"role": "user", "content": message}]
    return {**body, "messages": turns}
