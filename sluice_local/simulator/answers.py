"""What the simulated model says: deterministic replies, token counts and embedding vectors."""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Mapping
from typing import Any


def _lexicon(words: str) -> frozenset[str]:
    return frozenset(words.split())


_POSITIVE = _lexicon(
    "good great excellent amazing love loved loves lovely wonderful best fantastic enjoyed "
    "enjoy enjoyable perfect brilliant beautiful awesome superb fun recommend recommended "
    "happy nice outstanding masterpiece delightful favorite favourite liked like pleasant "
    "solid impressive charming gripping moving touching fresh clever funny hilarious "
    "stunning beautifully terrific worth satisfying glad works reliable fast"
)
_NEGATIVE = _lexicon(
    "bad terrible awful worst boring hate hated poor poorly waste wasted horrible "
    "disappointing disappointed disappointment dull stupid mediocre annoying weak broken "
    "useless refund slow ugly mess fails failed lame pointless predictable bland painful "
    "unwatchable forgettable tedious avoid worse garbage junk rubbish cheap flawed "
    "confusing ridiculous sadly unfortunately problem problems defective returned"
)
_NEGATORS = _lexicon("not no never isn't wasn't don't didn't doesn't can't couldn't won't hardly")
_WORD_RE = re.compile(r"[a-z']+")
_SENTIMENT_RE = re.compile(r"positive\s+or\s+negative\s*:", re.IGNORECASE)
_VOCAB = tuple(
    sorted(
        _lexicon(
            "the a simulated answer request provider batch token model river stone light quiet "
            "steady swift careful bright calm plain clear small large early late open simple "
            "gentle final ready useful short measured"
        )
    )
)


def sentiment(text: str) -> str:
    """Answer "positive" or "negative" by a small lexicon; a negator flips the next hit; ties are positive."""
    score = 0
    flip = False
    for word in _WORD_RE.findall(text.lower()):
        if word in _NEGATORS:
            flip = True
            continue
        hit = 1 if word in _POSITIVE else -1 if word in _NEGATIVE else 0
        if hit:
            score += -hit if flip else hit
            flip = False
    return "negative" if score < 0 else "positive"


def answer_for(prompt: str) -> str:
    """The deterministic reply to a prompt."""
    match = _SENTIMENT_RE.search(prompt)
    if match:
        return sentiment(prompt[match.end() :])
    digest = hashlib.blake2b(prompt.encode(), digest_size=16).digest()
    words = [_VOCAB[b % len(_VOCAB)] for b in digest[1 : 7 + digest[0] % 7]]
    return "Simulated reply: " + " ".join(words) + "."


def count_tokens(text: str) -> int:
    """Roughly 1.3 tokens a word, the way English text tokenises."""
    words = len(text.split())
    return round(words * 1.3) if words else 0


def limit_text(text: str, max_tokens: int | None) -> tuple[str, bool]:
    """`text` cut to at most `max_tokens`, and whether it was cut."""
    if max_tokens is None or count_tokens(text) <= max_tokens:
        return text, False
    words = text.split()
    keep = max(0, int(max_tokens / 1.3))
    while keep > 0 and round(keep * 1.3) > max_tokens:
        keep -= 1
    return " ".join(words[:keep]), True


def shorten(text: str) -> str:
    """The first half of `text` (at least a word): what an incomplete answer got to."""
    words = text.split()
    return " ".join(words[: max(1, len(words) // 2)])


def embedding_vector(text: str, dims: int) -> list[float]:
    """A deterministic unit vector for `text`."""
    raw = text.encode()
    values: list[int] = []
    block = 0
    while len(values) < dims:
        digest = hashlib.blake2b(raw, digest_size=64, salt=block.to_bytes(16, "little")).digest()
        values.extend(struct.unpack("<32h", digest))
        block += 1
    vec = [v / 32768.0 for v in values[:dims]]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def text_of(content: Any) -> str:
    """The text of a message's content, a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "\n".join(parts)
    return ""


def responses_prompt(data: Mapping[str, Any]) -> str:
    """The prompt of a Responses API request: its instructions and input, as text."""
    pieces: list[str] = []
    instructions = data.get("instructions")
    if isinstance(instructions, str):
        pieces.append(instructions)
    raw = data.get("input")
    if isinstance(raw, str):
        pieces.append(raw)
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, str):
                pieces.append(item)
            elif isinstance(item, dict):
                pieces.append(text_of(item.get("content", item.get("text"))))
    return "\n".join(pieces)


def positive_int(value: Any) -> int | None:
    """`value` if it is a non-negative int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None
