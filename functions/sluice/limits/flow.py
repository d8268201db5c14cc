"""Client-side flow control: an AIMD concurrency limit, RPM/TPM token buckets, and the gate
that keeps a worker sleeping out a retry from holding one of the engine's places.

Both sit on the per-attempt hot path, so the uncontended case is a couple of integer
comparisons and never allocates a future.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping

from sluice.providers import RATE_KINDS, RequestFormat


class AdaptiveLimit:
    """How many requests may be in flight, halved on throttling and regrown on success.

    Slots are granted in cohorts: each run of `max(limit, min_window)` consecutive grants
    shares a token, which `acquire` returns. The limit halves as soon as more than
    `tolerance` of one cohort has been throttled. Every cut raises a floor, and throttles
    from slots granted before the floor are ignored: the burst of 429s that answers one
    over-eager window halves the limit once, not once per request, while a request granted
    after the cut may still cut again.

    Cohorts are counted by grants, not by answers, because 429s come back at once and
    successes only after the model's latency: a window closed by answers would count all
    its 429s but only some of its successes, and read 10% random throttling as 30%.

    `tolerance=0` is textbook AIMD (any 429 halves). A small tolerance keeps a provider
    that throttles a steady few percent at random, whatever the load, from collapsing the
    limit to 1: each of those 429s already waits out its own Retry-After.
    """

    __slots__ = (
        "_cohort",
        "_cohort_granted",
        "_cohort_size",
        "_floor",
        "_in_flight",
        "_limit",
        "_sizes",
        "_throttled",
        "_waiters",
        "cap",
        "decrease",
        "min_limit",
        "min_window",
        "tolerance",
    )

    def __init__(
        self,
        cap: int,
        initial: int | None = None,
        *,
        min_limit: int = 1,
        decrease: float = 0.5,
        tolerance: float = 0.0,
        min_window: int = 20,
    ) -> None:
        if cap < 1:
            raise ValueError("cap must be >= 1")
        if not 0 < decrease < 1:
            raise ValueError("decrease must be in (0, 1)")
        if not 0 <= tolerance < 1:
            raise ValueError("tolerance must be in [0, 1)")
        self.cap = cap
        self.min_limit = max(1, min(min_limit, cap))
        self.decrease = decrease
        self.tolerance = tolerance
        # below this many requests a share is noise: at limit 4, one random 429 is "25%"
        self.min_window = max(1, min_window)
        start = cap if initial is None else initial
        self._limit = float(min(cap, max(self.min_limit, start)))
        self._in_flight = 0
        self._cohort = 0
        self._cohort_granted = 0
        self._cohort_size = max(int(self._limit), self.min_window)
        self._floor = 0
        # per live cohort: its size and how many of its requests were throttled
        self._sizes: dict[int, int] = {0: self._cohort_size}
        self._throttled: dict[int, int] = {}
        self._waiters: deque[asyncio.Future[int]] = deque()

    @property
    def limit(self) -> int:
        return int(self._limit)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def generation(self) -> int:
        """The token the next slot will carry."""
        return self._cohort

    def _grant(self) -> int:
        self._in_flight += 1
        token = self._cohort
        self._cohort_granted += 1
        if self._cohort_granted >= self._cohort_size:
            self._new_cohort()
        return token

    def _new_cohort(self) -> None:
        self._cohort += 1
        self._cohort_granted = 0
        self._cohort_size = max(int(self._limit), self.min_window)
        self._sizes[self._cohort] = self._cohort_size
        # cohorts far behind have answered long ago; keep the books O(1)
        stale = self._cohort - 64
        if stale in self._sizes:
            del self._sizes[stale]
            self._throttled.pop(stale, None)

    async def acquire(self, priority: bool = False) -> int:
        """Wait for a slot; returns the token to pass to `on_throttled`.

        `priority` jumps the queue: a retry has already waited its backoff and should not
        wait again behind requests that have not been sent once.
        """
        if self._in_flight < int(self._limit) and not self._waiters:
            return self._grant()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if priority:
            self._waiters.appendleft(fut)
        else:
            self._waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # granted and cancelled in the same tick: hand the slot on, don't leak it
                self.release()
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise

    def release(self) -> None:
        self._in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self._in_flight < int(self._limit):
            fut = waiters.popleft()
            if fut.done():
                continue
            fut.set_result(self._grant())

    def on_success(self, token: int | None = None) -> None:
        if self._limit < self.cap:
            # +1/limit per success is about +1 per full window of successes
            self._limit = min(float(self.cap), self._limit + 1.0 / self._limit)
            self._wake()

    def on_throttled(self, token: int) -> bool:
        """Record a 429 for a slot granted with `token`; True if the limit shrank."""
        if token < self._floor:
            return False
        size = self._sizes.get(token)
        if size is None:
            return False
        count = self._throttled.get(token, 0) + 1
        self._throttled[token] = count
        if count <= self.tolerance * size:
            return False
        self._limit = max(float(self.min_limit), math.floor(self._limit * self.decrease))
        # everything granted so far predates the cut; only later grants may cut again
        self._new_cohort()
        self._floor = self._cohort
        return True


class Gate:
    """Permits to hold an item that is being worked on (not sleeping between attempts).

    A worker keeps its permit from item to item, so the fault-free path never touches the
    queue; it hands the permit to a standby worker only when it goes to sleep for a retry.
    """

    __slots__ = ("free", "waiters")

    def __init__(self, permits: int) -> None:
        self.free = permits
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def enter(self) -> None:
        if self.free > 0 and not self.waiters:
            self.free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        await fut

    def leave(self) -> None:
        waiters = self.waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1


class _Bucket:
    """Reserve-then-wait token bucket: a caller takes its cost at once (possibly into debt)
    and sleeps until the debt is repaid, so concurrent callers queue in arrival order
    without a lock, and a cost larger than the bucket still gets through, just paced."""

    __slots__ = ("capacity", "level", "rate", "stamp")

    def __init__(self, per_minute: float, burst_s: float, now: float) -> None:
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate * burst_s)
        self.level = self.capacity
        self.stamp = now

    def reserve(self, cost: float, now: float) -> float:
        """Take `cost`; return how many seconds the caller must wait before sending."""
        level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        level -= cost
        self.level = level
        return 0.0 if level >= 0 else -level / self.rate


class RatePacer:
    """Requests-per-minute and tokens-per-minute pacing; 0 means unlimited.

    Also honours the provider's own view: when an answer's rate-limit headers say a limit has
    nothing left, every sender waits until they say it resets.
    """

    __slots__ = (
        "_blocked_until",
        "_clock",
        "_requests",
        "_sleep",
        "_tokens",
        "rpm",
        "tpm",
    )

    def __init__(
        self,
        rpm: float = 0,
        tpm: float = 0,
        *,
        burst_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._clock = clock
        self._sleep = sleep
        now = clock()
        self._requests = _Bucket(rpm, burst_s, now) if rpm > 0 else None
        self._tokens = _Bucket(tpm, burst_s, now) if tpm > 0 else None
        self._blocked_until = 0.0

    @property
    def active(self) -> bool:
        """False when there is nothing to pace, so the engine can skip the call entirely."""
        return self._requests is not None or self._tokens is not None or self._blocked_until > 0

    async def take(self, tokens: int = 0) -> float:
        """Wait until one request of `tokens` tokens may be sent; returns seconds waited."""
        now = self._clock()
        wait = 0.0
        if self._blocked_until > now:
            wait = self._blocked_until - now
        elif self._blocked_until:
            self._blocked_until = 0.0
        if self._requests is not None:
            wait = max(wait, self._requests.reserve(1.0, now))
        if self._tokens is not None and tokens > 0:
            wait = max(wait, self._tokens.reserve(float(tokens), now))
        if wait > 0:
            await self._sleep(wait)
        return wait

    def observe_headers(self, headers: Mapping[str, str], request_format: RequestFormat) -> None:
        """Block every sender until the reset of a limit the answer's headers say is spent."""
        for kind in RATE_KINDS:
            if request_format.left(headers, kind) != 0:
                continue
            reset = request_format.reset_s(headers, kind, time.time())
            if reset is None:
                # exhausted with no reset hint: a short pause beats hammering into 429s
                reset = 1.0
            until = self._clock() + reset
            self._blocked_until = max(self._blocked_until, until)


# Lambda gives a function 1,024 file descriptors
# (https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html). Besides its provider
# connections a shard Lambda holds the AWS SDK's pools (five clients, up to 10 connections each),
# the runtime's own (stdio, the Runtime API connection, epoll, the interpreter's files) and the
# event loop's (its self-pipe).
LAMBDA_FILE_DESCRIPTORS = 1024
AWS_CLIENT_FDS = 5 * 10
RUNTIME_FDS = 16
EVENT_LOOP_FDS = 8
MAX_SHARD_CONNECTIONS = LAMBDA_FILE_DESCRIPTORS - AWS_CLIENT_FDS - RUNTIME_FDS - EVENT_LOOP_FDS
