"""The Anthropic family: the Messages API, and chat-completions lines translated to it."""

from __future__ import annotations

from .format import ANTHROPIC, AnthropicFormat

__all__ = ["ANTHROPIC", "AnthropicFormat"]
