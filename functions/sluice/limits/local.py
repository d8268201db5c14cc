"""One limiter key as one shard sees it (`LocalKey`), and the changes a shard makes to the key's
shared item: `Joining` (what it sent before it knew the rate) and `chained` (one answer's changes
as one write). `sluice.limits.shared` draws on them."""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from sluice.limits.lease import Bucket, LeasePolicy, joined

# the requests a shard sent before it knew the rate, kept (when, tokens) to debit them from the
# item it then finds: more than a shard's connections can hold at once
_UNPACED_KEPT = 4096


def limit_key(base_url: str, api_key: str, model: str) -> str:
    """The limiter's partition key. Only a hash prefix of the key is stored: a table reader
    can tell two keys apart but learns nothing that lets them call the provider."""
    digest = hashlib.sha256(f"{base_url.rstrip('/')}|{api_key}".encode()).hexdigest()[:16]
    return f"LIMIT#{digest}#{model}"


class LocalKey:
    """One limiter key as one shard sees it: the unspent rest of its lease (`tokens` may be a
    debt), when it may be sent, the end of the shard's period, and the rates it knows."""

    def __init__(self, pk: str) -> None:
        self.pk = pk
        self.requests = 0
        self.tokens = 0.0
        self.rate: float | None = None
        self.token_rate = 0.0
        self.window_s = 0.0
        self.paused_until = 0.0
        # the pause this shard last wrote to the item
        self.paused_written = 0.0
        # the lease's requests may go from here (a lease taken into debt), until the period's end
        self.ready_at = 0.0
        self.until = 0.0
        # what the last lease set the shard's seat to, and whether the bucket held surplus after it
        self.seat_until = 0.0
        self.more = False
        # what a request of this key has cost lately, in estimated tokens (a moving average)
        self.cost = 0.0
        # the provider answers without rate headers: nothing to share
        self.off = False
        # when to look for the item (again): without it, requests go unpaced until an answer or
        # another shard tells the rate
        self.look_at = 0.0
        self.look_every = 0.0
        # the first answer with rate headers is being written to the item: requests wait for it
        self.joining: asyncio.Task[None] | None = None
        # this shard claimed the placeholder: its answers say what the others wait for
        self.learner = False
        self.opened = False
        # what went unpaced: (when, estimated tokens) of each request sent before the rate was known
        self.unpaced: deque[tuple[float, int]] = deque(maxlen=_UNPACED_KEPT)
        # workers waiting in `take`: how much of a surplus the shard could use at once
        self.waiting = 0
        self.lock = asyncio.Lock()

    def unpaced_since(self, since: float) -> tuple[int, float]:
        """The requests and tokens sent unpaced from `since` on: not in a level set then."""
        sent = [tokens for when, tokens in self.unpaced if when >= since]
        return len(sent), float(sum(sent))


class Joining:
    """The change a shard that sent unpaced makes to the item it finds (`lease.joined`)."""

    def __init__(
        self,
        local: LocalKey,
        clock: Callable[[], float],
        policy: LeasePolicy,
        remaining: tuple[float, float] | None = None,
    ) -> None:
        self._local = local
        self._clock = clock
        self._policy = policy
        self._remaining = remaining

    def __call__(self, bucket: Bucket) -> Bucket | None:
        unpaced = self._local.unpaced_since(bucket.since)
        return joined(bucket, self._clock(), self._policy, unpaced, self._remaining)


def chained(changes: list[Callable[[Bucket], Bucket | None]]) -> Callable[[Bucket], Bucket | None]:
    """The changes one after the other, as one write (one version more than the item read)."""

    def how(bucket: Bucket) -> Bucket | None:
        changed = None
        for change in changes:
            changed = change(changed or bucket) or changed
        return None if changed is None else replace(changed, version=bucket.version + 1)

    return how
