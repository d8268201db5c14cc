"""The OpenAI family: OpenAI and the providers that copy its API.

`batch` imports the SDK (about a second): nothing here imports it, so only batch runs pay for it.
"""

from __future__ import annotations

from .format import OPENAI, OpenAIFormat

__all__ = ["OPENAI", "OpenAIFormat"]
