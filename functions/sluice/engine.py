"""The direct-mode hot path: a fixed pool of workers pushing Requests through one session.

Memory is O(concurrency): the workers pull from one shared iterator, so the engine never
holds more than `concurrency` requests, tasks or responses at once however long the input.
Provider behaviour (429s, 5xx, timeouts, resets, garbage) always ends in an Outcome; an
exception escaping `fan_out` is a bug in Sluice, in the iterator or in the sink.
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sized
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from yarl import URL

from .limits import AdaptiveLimit, RateBudget
from .model import ErrorCode, Outcome, Request
from .retry import DEFAULT_POLICY, RetryPolicy, is_retryable, next_delay_s

_EXCERPT = 300
# per-path URLs are parsed once; polls (/v1/responses/<id>) are unique, so don't cache forever
_URL_CACHE_MAX = 64
_GC_GEN0 = 20_000
_START_BATCH = 10
# above asyncio's per-read buffer (256 KiB); see _keep_read_buffers_off_mmap
_MMAP_THRESHOLD_HINT = 1 << 20


@dataclass(frozen=True, slots=True)
class EngineSettings:
    concurrency: int = 200
    policy: RetryPolicy = DEFAULT_POLICY
    rpm: float = 0
    tpm: float = 0
    user_agent: str = "sluice/0.1"
    # AIMD starts here (default: at `concurrency`) and never grows past `concurrency`
    initial_limit: int | None = None
    # share of a cohort of requests that may be 429s before the limit halves (see AdaptiveLimit)
    throttle_tolerance: float = 0.2
    # Standby workers, as a share of `concurrency`, that take new items while others sleep
    # out a Retry-After. Without them every 429 idles a worker for the whole wait. They only
    # wake when a worker goes to sleep, so a healthy run still holds at most `concurrency`
    # items; the worst case is concurrency * (1 + retry_headroom).
    retry_headroom: float = 0.5
    # see fan_out: fewer, cheaper garbage collections while the engine runs
    tune_gc: bool = True


@dataclass(slots=True)
class EngineStats:
    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    attempts: int = 0
    retries: int = 0
    throttled_429: int = 0
    server_errors: int = 0
    connection_errors: int = 0
    stopped_early: bool = False
    remaining: int = 0
    limit_min: int = 0
    limit_final: int = 0
    elapsed_s: float = 0.0
    error_codes: dict[str, int] = field(default_factory=dict)


def join_url(base_url: str, path: str) -> str:
    """Base URLs conventionally end in /v1 and request paths start with it; say it once."""
    base = base_url.rstrip("/")
    if not path.startswith("/"):
        path = "/" + path
    if base.endswith("/v1") and (path == "/v1" or path.startswith("/v1/")):
        path = path[3:]
    return base + path


def _orjson_str(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def make_session(concurrency: int, *, user_agent: str | None = None) -> aiohttp.ClientSession:
    """One session per shard: the connection pool is sized to the worker pool, so a worker
    never waits for a socket another worker isn't using."""
    connector = aiohttp.TCPConnector(
        limit=concurrency,
        limit_per_host=concurrency,
        ttl_dns_cache=300,
        keepalive_timeout=30,
    )
    return aiohttp.ClientSession(
        connector=connector,
        # per-request totals come from the RetryPolicy; here only guard the connect phase
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=15),
        json_serialize=_orjson_str,
        # an API client has no use for cookies (a CDN's bot cookie at most); skipping the jar
        # saves filtering and parsing them on every request
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={"User-Agent": user_agent} if user_agent else None,
        raise_for_status=False,
    )


def _provider_error(parsed: Any) -> tuple[str | None, str | None]:
    """(code, message) from an OpenAI-style error body; tolerant of every other shape."""
    if not isinstance(parsed, dict):
        return None, None
    error = parsed.get("error")
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        message = error.get("message")
        return (str(code) if code else None), (str(message) if message else None)
    if isinstance(error, str):
        return error, None
    code = parsed.get("code")
    message = parsed.get("message") or parsed.get("detail")
    return (str(code) if code else None), (str(message) if message else None)


def _never() -> bool:
    return False


class _GcTuning:
    """Fewer, cheaper garbage collections while any engine in the process runs.

    Every request allocates a few hundred short-lived containers, so the default gen-0
    threshold (700) runs a collection every couple of requests, and the older generations
    rescan every long-lived module object each time. Freezing what exists and collecting less
    often cuts ~10% of the engine's CPU. The collector is process-wide and the local cloud
    runs many shards at once on threads, so the first engine in tunes it and the last one out
    restores it; asking `gc.get_freeze_count()` per shard instead walks every frozen object,
    which in a local cloud holding millions of them cost ~0.1 s of CPU per shard.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._threshold = gc.get_threshold()
        self._unfreeze = False

    @contextmanager
    def __call__(self, enabled: bool) -> Iterator[None]:
        if not enabled:
            yield
            return
        with self._lock:
            if self._users == 0:
                self._threshold = gc.get_threshold()
                # nothing of ours is frozen now, so this counts only a freeze the caller made,
                # which it is left to undo
                self._unfreeze = gc.get_freeze_count() == 0
                gc.freeze()
                gc.set_threshold(max(self._threshold[0], _GC_GEN0), *self._threshold[1:])
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    gc.set_threshold(*self._threshold)
                    if self._unfreeze:
                        gc.unfreeze()


_tuned_gc = _GcTuning()


def _keep_read_buffers_off_mmap() -> None:
    """asyncio's selector transports read every response into a fresh 256 KiB bytes object.
    glibc serves blocks that size with mmap until a freed mmapped block teaches it a higher
    threshold, so without this every read costs an mmap, an mremap, a munmap and page
    faults: about a fifth of the CPU per request in bench/engine.py. Freeing one larger
    block raises glibc's threshold for the life of the process (two syscalls, so it is
    cheap to repeat per call); with another allocator it is just a short-lived allocation."""
    block = bytes(_MMAP_THRESHOLD_HINT)
    del block


class _Gate:
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


async def fan_out(
    requests: Iterable[Request],
    *,
    session: aiohttp.ClientSession,
    base_url: str,
    api_key: str,
    settings: EngineSettings,
    sink: Callable[[Outcome], None],
    should_stop: Callable[[], bool] = _never,
    count_remaining: bool = True,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    rand: Callable[[], float] = random.random,
) -> EngineStats:
    """Send every request, retrying per `settings.policy`, and hand each Outcome to `sink`.

    Once `should_stop()` turns true no new request is taken; those in flight (including
    their retries) still finish and reach the sink. `stats.remaining` counts the rest (by
    `len()` when `requests` is Sized, else by draining the iterator; with `count_remaining=False`
    it is only 1 or 0, and one item past the stop is read to know which).
    """
    if settings.concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    policy = settings.policy
    stats = EngineStats()
    limiter = AdaptiveLimit(settings.concurrency, settings.initial_limit, tolerance=settings.throttle_tolerance)
    stats.limit_min = limiter.limit
    budget = RateBudget(settings.rpm, settings.tpm)
    timeout = aiohttp.ClientTimeout(total=policy.request_timeout_s)
    base_headers = {
        "Authorization": f"Bearer {api_key}",
        "Content-Type": "application/json",
        "User-Agent": settings.user_agent,
    }
    gate = _Gate(settings.concurrency)
    workers = settings.concurrency + math.ceil(settings.concurrency * max(0.0, settings.retry_headroom))
    url_cache: dict[str, URL] = {}
    send = session.request
    acquire = limiter.acquire
    release = limiter.release
    on_success = limiter.on_success
    observe = budget.observe_headers
    monotonic = time.monotonic
    error_codes = stats.error_codes
    it = iter(requests)
    taken = 0
    stopping = False
    exhausted = False

    def url_for(path: str) -> URL:
        url = url_cache.get(path)
        if url is None:
            url = URL(join_url(base_url, path))
            if len(url_cache) < _URL_CACHE_MAX:
                url_cache[path] = url
        return url

    def finish_error(
        req: Request,
        code: str,
        message: str,
        status: int | None,
        body: Any,
        headers: Mapping[str, str] | None,
        attempt: int,
        started: float,
        throttled: int,
    ) -> Outcome:
        stats.failed += 1
        error_codes[code] = error_codes.get(code, 0) + 1
        request_id = headers.get("x-request-id") if headers is not None else None
        return Outcome(
            line=req.line,
            custom_id=req.custom_id,
            status_code=status,
            body=body,
            request_id=request_id,
            error_code=code,
            error_message=message,
            attempts=attempt,
            latency_s=monotonic() - started,
            throttled=throttled,
            headers=dict(headers) if headers is not None else {},
        )

    async def run_one(req: Request, held: list[bool]) -> Outcome:
        url = url_for(req.path)
        method = req.method
        data = req.body
        headers = {**base_headers, "x-sluice-custom-id": req.custom_id}
        attempt = 0
        throttled = 0
        started = 0.0
        while True:
            attempt += 1
            token = await acquire(attempt > 1)
            status: int | None = None
            raw = b""
            rheaders: Mapping[str, str] | None = None
            failure = ""
            try:
                if budget.active:
                    await budget.take(req.estimated_tokens)
                if attempt == 1:
                    started = monotonic()
                stats.attempts += 1
                async with send(method, url, data=data, headers=headers, timeout=timeout) as resp:
                    status = resp.status
                    rheaders = resp.headers
                    raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                # a status with no body (reset mid-read) still counts as a lost connection
                status = None
                stats.connection_errors += 1
                text = str(exc)
                failure = type(exc).__name__ + (": " + text[:_EXCERPT] if text else "")
            finally:
                release()

            if rheaders is not None:
                observe(rheaders)

            parsed: Any = None
            body_code: str | None = None
            status_for_retry = status
            if status is not None:
                if 200 <= status < 300:
                    try:
                        parsed = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        failure = f"HTTP {status} with a body that is not JSON: {raw[:_EXCERPT]!r}"
                        # a mangled success is a transient fault, not an answer
                        status_for_retry = None
                    else:
                        on_success(token)
                        stats.succeeded += 1
                        request_id = rheaders.get("x-request-id") if rheaders is not None else None
                        if request_id is None and isinstance(parsed, dict):
                            rid = parsed.get("id")
                            request_id = rid if isinstance(rid, str) else None
                        return Outcome(
                            line=req.line,
                            custom_id=req.custom_id,
                            status_code=status,
                            body=parsed,
                            request_id=request_id,
                            attempts=attempt,
                            latency_s=monotonic() - started,
                            throttled=throttled,
                        )
                else:
                    try:
                        parsed = orjson.loads(raw) if raw else None
                    except orjson.JSONDecodeError:
                        parsed = raw.decode("utf-8", "replace")[:_EXCERPT]
                    body_code, message = _provider_error(parsed)
                    failure = f"HTTP {status}" + (f": {message}" if message else "")
                    if body_code and (not message or body_code not in message):
                        failure += f" ({body_code})"
                    if status == 429 or (body_code is not None and body_code in policy.retryable_body_codes):
                        throttled += 1
                        if status == 429:
                            stats.throttled_429 += 1
                        if limiter.on_throttled(token) and limiter.limit < stats.limit_min:
                            stats.limit_min = limiter.limit
                    elif status >= 500:
                        stats.server_errors += 1

            if not is_retryable(status_for_retry, body_code, policy):
                return finish_error(
                    req,
                    ErrorCode.PROVIDER_ERROR,
                    failure,
                    status,
                    parsed,
                    rheaders,
                    attempt,
                    started,
                    throttled,
                )
            if attempt >= policy.max_attempts:
                return finish_error(
                    req,
                    ErrorCode.RETRIES_EXHAUSTED,
                    f"gave up after {attempt} attempts; last: {failure}",
                    status,
                    parsed,
                    rheaders,
                    attempt,
                    started,
                    throttled,
                )
            delay = next_delay_s(attempt, policy, rheaders, time.time(), rand)
            if delay > policy.max_retry_after_s:
                return finish_error(
                    req,
                    ErrorCode.RETRIES_EXHAUSTED,
                    f"provider asked to wait {delay:.0f}s (more than {policy.max_retry_after_s:.0f}s) "
                    f"after attempt {attempt}; last: {failure}",
                    status,
                    parsed,
                    rheaders,
                    attempt,
                    started,
                    throttled,
                )
            stats.retries += 1
            if held[0]:
                held[0] = False
                gate.leave()
            await sleep(delay)

    async def worker() -> None:
        nonlocal taken, stopping, exhausted
        held = [False]
        while True:
            if not held[0]:
                await gate.enter()
                held[0] = True
            if stopping or exhausted:
                break
            if should_stop():
                stopping = True
                break
            try:
                req = next(it)
            except StopIteration:
                exhausted = True
                break
            taken += 1
            sink(await run_one(req, held))
        # pass the permit on so a standby worker wakes, sees the end, and exits in turn
        gate.leave()

    _keep_read_buffers_off_mmap()
    t0 = monotonic()
    try:
        with _tuned_gc(settings.tune_gc):
            async with asyncio.TaskGroup() as group:
                for index in range(workers):
                    group.create_task(worker())
                    if index % _START_BATCH == _START_BATCH - 1:
                        # Opening a connection costs ~0.3 ms of CPU. Started all at once, 1000
                        # workers would each open theirs before any request leaves; in batches,
                        # the first requests go out while later workers are still connecting.
                        await asyncio.sleep(0)
    except BaseExceptionGroup as group_error:
        # callers want the bug itself, not a group; several workers often trip on the same one
        first = group_error.exceptions[0]
        raise first from (group_error if len(group_error.exceptions) > 1 else None)

    stats.sent = taken
    stats.limit_final = limiter.limit
    stats.elapsed_s = monotonic() - t0
    if stopping and not exhausted:
        if isinstance(requests, Sized) and requests is not it:
            stats.remaining = max(0, len(requests) - taken)
        elif count_remaining:
            stats.remaining = sum(1 for _ in it)
        else:
            # the caller resumes from its own checkpoint: whether anything is left is enough,
            # and counting would read (a shard: download) the rest of the source for nothing
            stats.remaining = 0 if next(it, None) is None else 1
        stats.stopped_early = stats.remaining > 0
    return stats
