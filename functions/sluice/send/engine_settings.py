"""What the engine (`sluice.send.engine`) is given and gives back: one `EngineSettings` with everything a
call of `fan_out` works from (its endpoint, knobs, limits and hooks), the `EngineStats` it returns, and
the HTTP session it sends through (`make_session`).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from sluice.contract import DEFAULT_PROVIDER, ProviderRefused
from sluice.core.retry import DEFAULT_POLICY, RetryPolicy
from sluice.limits.budget import Budget
from sluice.limits.shared import SharedLimit
from sluice.providers import RequestFormat, Signer, family
from sluice.send.output_check import OutputCheck
from sluice.send.refusal import RefusalWatch

# how a run opens the HTTP session it sends through, for a pool of this many workers (`make_session`)
SessionFactory = Callable[[int], AbstractAsyncContextManager[aiohttp.ClientSession]]


def _never() -> bool:
    return False


def _forever() -> float:
    return math.inf


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
    # when the first this many answers are all the same non-retryable error, stop taking requests
    # (`sluice.send.refusal`); 0 never stops
    fail_fast_after: int = 0
    # the provider's request format (`sluice.providers`): a shard's is its spec's family
    request_format: RequestFormat = field(default_factory=lambda: family(DEFAULT_PROVIDER))
    # a validating job's checks (`sluice.send.output_check`): an invalid answer is sent again
    output_check: OutputCheck | None = None
    # where requests go, and the key they carry (none for a family that signs each request: `sign`)
    base_url: str = ""
    api_key: str = ""
    # a family that authenticates with AWS credentials, not `api_key`, signs each attempt
    sign: Signer | None = None
    # once true, no new request is taken; those in flight (and their retries) still finish
    should_stop: Callable[[], bool] = _never
    # how `stats.remaining` is known once stopped: counted (False: only whether one is left)
    count_remaining: bool = True
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep
    rand: Callable[[], float] = random.random
    # the key-wide limit every attempt draws from (`sluice.limits.shared`), when on
    shared: SharedLimit | None = None
    # each request reserved before it is sent and settled with its answer
    budget: Budget | None = None
    # the watch of `fail_fast_after` (one of the call's own when None), to share it with another call
    refusals: RefusalWatch | None = None
    # seconds an answer may still arrive in (a Lambda's end), which bounds a slow tier's wait
    time_left: Callable[[], float] = _forever


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
    # the run stopped because the provider refused its first answers (`fail_fast_after`)
    refused: ProviderRefused | None = None
    # requests in flight when it did, given up rather than waited for (`given_up_outcome`)
    given_up: int = 0
    # requests asked at a tier (flex) that went on at the standard one: the tier had no capacity,
    # or the model refused it (`tier_refused`: what it said, and every later request goes at standard)
    tier_fallbacks: int = 0
    tier_refused: str | None = None


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
