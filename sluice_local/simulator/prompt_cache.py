"""The simulator's stand-in for Anthropic's prompt cache, so a run can see cache reads and writes priced.

A system prompt given as blocks, one of them marked `cache_control`, has a cacheable prefix: the
blocks up to the last marked one. The first request with a prefix writes it; later ones with the
same model and prefix read it. Unlike Anthropic's there is no minimum length and no expiry, and the
cache holds at most MAX_PREFIXES prefixes (the oldest goes first), so it stays small however long
a run is.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from sluice_local.simulator.answers import count_tokens, text_of

MAX_PREFIXES = 10_000


class PromptCache:
    def __init__(self) -> None:
        self._prefixes: OrderedDict[bytes, None] = OrderedDict()

    def use(self, model: str, system: Any) -> tuple[int, int]:
        """The (read, written) tokens of a request whose system prompt is `system`."""
        if not isinstance(system, list):
            return 0, 0
        marked = [n for n, block in enumerate(system) if isinstance(block, dict) and block.get("cache_control")]
        if not marked:
            return 0, 0
        prefix = text_of(system[: marked[-1] + 1])
        tokens = count_tokens(prefix)
        key = hashlib.blake2b(f"{model}\0{prefix}".encode(), digest_size=16).digest()
        if key in self._prefixes:
            self._prefixes.move_to_end(key)
            return tokens, 0
        self._prefixes[key] = None
        if len(self._prefixes) > MAX_PREFIXES:
            self._prefixes.popitem(last=False)
        return 0, tokens
