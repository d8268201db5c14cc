"""OpenAI and every provider that speaks its API."""

from __future__ import annotations

from .format import OPENAI, OpenAIFormat

__all__ = ["OPENAI", "OpenAIFormat"]
