"""What a chat-completions line may ask that only OpenAI's family answers: the fields a family that
translates chat lines (Anthropic's Messages, Bedrock's Converse) refuses unless each holds its
no-op value, and the roles a chat turn takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SYSTEM_ROLES = frozenset({"system", "developer"})
TURN_ROLES = frozenset({"user", "assistant"})
# each field with the values that ask for nothing beyond one plain answer
UNTRANSLATED: Mapping[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "seed": (None,),
    "stream": (None, False),
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}
