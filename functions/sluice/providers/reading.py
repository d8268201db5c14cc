"""What validation reads of a request and its answer, whatever the wire: the family readers
(`openai.answers`, `anthropic.answers`) fill these by the line's path (`answers`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Asked:
    """What a request asked its answer to be: JSON (`json`), and to match `schema` (the request's
    own JSON schema; None when it gives none)."""

    json: bool = False
    schema: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What an answer holds: its text (None when it has none), its tool calls' arguments (each as the
    wire gives them: JSON text, or an object already parsed), whether it was cut short at its output
    limit, and why it was refused (a refusal's text, or that a content filter stopped it; None when
    it was not)."""

    text: str | None
    arguments: tuple[str | dict[str, Any], ...] = ()
    cut_short: bool = False
    refused: str | None = None
