"""Reading answers for validation (issue 33), keyed by the path a line was written for: a family's
`from_wire` gives an answer back in that line's shape, so a chat line answered by Anthropic reads
as a chat.completion, and every family's answers validate the same way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .anthropic import answers as anthropic_answers
from .gemini import answers as gemini_answers
from .openai import answers as openai_answers
from .reading import Answer, Asked

_ASKED: Mapping[str, Callable[[Mapping[str, Any]], Asked]] = {
    openai_answers.CHAT: openai_answers.chat_asked,
    openai_answers.RESPONSES: openai_answers.responses_asked,
    anthropic_answers.MESSAGES: anthropic_answers.messages_asked,
}
_READ: Mapping[str, Callable[[Any], Answer | None]] = {
    openai_answers.CHAT: openai_answers.chat_answer,
    openai_answers.RESPONSES: openai_answers.responses_answer,
    anthropic_answers.MESSAGES: anthropic_answers.messages_answer,
}
_REPAIR: Mapping[str, Callable[[dict[str, Any], str, str], dict[str, Any]]] = {
    openai_answers.CHAT: openai_answers.chat_repair,
    openai_answers.RESPONSES: openai_answers.responses_repair,
    anthropic_answers.MESSAGES: anthropic_answers.messages_repair,
}
# the paths whose answers validation can read
PATHS = frozenset(_READ)


def asked(path: str, body: Mapping[str, Any]) -> Asked:
    """What the request `body` to `path` asked its answer to be; nothing for a path not read. A
    line kept as a generateContent request (Gemini's) is read as one, whatever its path."""
    if gemini_answers.is_generate(body):
        return gemini_answers.generate_asked(body)
    reader = _ASKED.get(path)
    return reader(body) if reader is not None else Asked()


def read(path: str, body: Any) -> Answer | None:
    """What the answer `body` to a line for `path` holds; None for a path whose answers are not read
    (embeddings) or a body of no known shape."""
    reader = _READ.get(path)
    return reader(body) if reader is not None else None


def repair(path: str, body: dict[str, Any], answer: str, message: str) -> dict[str, Any]:
    """The request `body` sent again with its last answer and, as a follow-up user turn, what was
    wrong with it (`message`); `body` itself for a path that cannot take the turn."""
    if gemini_answers.is_generate(body):
        return gemini_answers.generate_repair(body, answer, message)
    repairer = _REPAIR.get(path)
    return repairer(body, answer, message) if repairer is not None else body
