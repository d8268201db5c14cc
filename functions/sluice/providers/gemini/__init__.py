"""The Gemini family: `generateContent` for chat and Responses lines (`translate`), the Batch API with
inline requests or a Files API upload (`batch`), and the flex tier."""

from __future__ import annotations

from .format import GEMINI, GeminiFormat

__all__ = ["GEMINI", "GeminiFormat"]
