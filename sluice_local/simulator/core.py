"""What every part of one simulator shares: the live config, object ids, attempt counters, the clock."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

from sluice_local.simulator.config import SimConfig
from sluice_local.simulator.prompt_cache import PromptCache

MAX_ATTEMPT_KEYS = 200_000
# emits a webhook event: (event type, object id)
Emit = Callable[[str, str], None]


class Core:
    """The shared state. All methods run on the simulator's event loop."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.started = time.time()
        self._run = secrets.token_hex(3)
        self._ids = itertools.count(1)
        # the attempts of the last MAX_ATTEMPT_KEYS keys: a retry comes soon after its request, and
        # a run of millions of lines would otherwise keep a count for each
        self.attempts: OrderedDict[str, int] = OrderedDict()
        # the Messages API's prompt cache: the prefixes a request marked with cache_control
        self.prompt_cache = PromptCache()

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{self._run}{next(self._ids):010x}"

    def next_attempt(self, key: str) -> int:
        """This key's attempt number (0-based), counting this one."""
        attempt = self.attempts.pop(key, 0)
        self.attempts[key] = attempt + 1
        if len(self.attempts) > MAX_ATTEMPT_KEYS:
            self.attempts.popitem(last=False)
        return attempt

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()
