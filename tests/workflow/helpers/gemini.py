"""What test_gemini.py and the tests beside it share."""

from __future__ import annotations

from typing import Any

from tests.workflow.helpers.batch import lines

FLEX_MODEL = "gemini-2.5-flash"


def gemini_lines(count: int, model: str = FLEX_MODEL) -> list[bytes]:
    return [line.replace(b'"gpt-4o-mini"', f'"{model}"'.encode()) for line in lines(count)]


def generated(simulator: Any) -> list[dict[str, Any]]:
    """The generateContent requests the simulator answered or refused, as its log has them."""
    return [e for e in simulator.log if e["method"] == "POST" and e["path"].endswith(":generateContent")]


def batch_creates(simulator: Any) -> list[dict[str, Any]]:
    return [e for e in simulator.log if e["method"] == "POST" and e["path"].endswith(":batchGenerateContent")]
