"""The Amazon Bedrock family. Direct: the Converse API for chat lines, InvokeModel for Messages lines,
each request signed with the function's AWS credentials. Batch inference: `batch`, `records`."""

from __future__ import annotations

from .format import BEDROCK, BedrockFormat

__all__ = ["BEDROCK", "BedrockFormat"]
