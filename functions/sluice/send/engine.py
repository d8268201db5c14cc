"""The direct-mode hot path: a fixed pool of workers pushing Requests through one session.

Three parts, in the manner of openai-python's `_base_client.py`: `classify` (pure) says what
an answer means, `_Run.send` is one flat loop of attempts acting on that verdict, and the
limiter (`limits`) decides when an attempt may start.

Memory is O(concurrency): the workers pull from one shared iterator, so the engine never
holds more than `concurrency` requests, tasks or responses at once however long the input.
Provider behaviour (429s, 5xx, timeouts, resets, garbage) always ends in an Outcome; an
exception escaping `fan_out` is a bug in Sluice, in the iterator or in the sink.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any

import aiohttp
from yarl import URL

from sluice.contract import ProviderRefused, causes
from sluice.contract.model import ErrorCode, Outcome, Request, ServiceTier
from sluice.core.retry import falls_back, tier_timeout_s
from sluice.limits.flow import AdaptiveLimit, Gate, RatePacer
from sluice.limits.shared import Ticket
from sluice.send.classify import FAIL, OK, AttemptVerdict, classify, describe_lost, throttle_said
from sluice.send.engine_settings import EngineSettings as EngineSettings
from sluice.send.engine_settings import EngineStats as EngineStats
from sluice.send.engine_settings import SessionFactory as SessionFactory
from sluice.send.engine_settings import make_session as make_session
from sluice.send.output_check import OutputCheck
from sluice.send.process_tuning import keep_read_buffers_off_mmap, tuned_gc
from sluice.send.refusal import RefusalWatch, given_up_message

# per-path URLs are parsed once; polls (/v1/responses/<id>) are unique, so don't cache forever
_URL_CACHE_MAX = 64
_START_BATCH = 10


async def fan_out(
    requests: Iterable[Request],
    sink: Callable[[Outcome], None],
    settings: EngineSettings,
    *,
    session: aiohttp.ClientSession,
) -> EngineStats:
    """Send every request through `session`, retrying per `settings.policy`, and hand each Outcome to
    `sink`. Everything else the call works from is in `settings` (`EngineSettings`).

    With a `settings.budget`, each request is reserved before it is sent and settled with its answer;
    once the budget refuses one, no more are taken (that one is not sent, and not in the sink).

    Once `settings.should_stop()` turns true no new request is taken; those in flight (including
    their retries) still finish and reach the sink. Once the first `fail_fast_after` outcomes
    were all one refusal (`stats.refused` says which), no new request is taken either, and
    those in flight are given up at once: each reaches the sink as `provider_refused`
    (`stats.given_up`), so the run ends with its last refusal, not with its slowest request.
    `stats.remaining` counts the rest (by `len()` when `requests` is Sized, else by draining the
    iterator; with `count_remaining=False` it is only 1 or 0, and one item past the stop is read
    to know which).
    """
    if settings.concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    run = _Run(session, settings, sink)
    it = iter(requests)
    # an iterator is its own iter(): its len(), if it has one, no longer counts what is left
    own_iterator = it is requests
    await run.run(it)
    stats = run.stats
    if run.stopping and not run.exhausted:
        if isinstance(requests, Sized) and not own_iterator:
            stats.remaining = max(0, len(requests) - run.taken)
        elif settings.count_remaining:
            stats.remaining = sum(1 for _ in it)
        else:
            # the caller resumes from its own checkpoint: whether anything is left is enough,
            # and counting would read (a shard: download) the rest of the source for nothing
            stats.remaining = 0 if next(it, None) is None else 1
        stats.stopped_early = stats.remaining > 0
    return stats


class _Run:
    """One call of `fan_out`: its workers, the attempt loop, and the figures they keep."""

    def __init__(
        self, session: aiohttp.ClientSession, settings: EngineSettings, sink: Callable[[Outcome], None]
    ) -> None:
        self.settings = settings
        self.sign = settings.sign
        self.format = settings.request_format
        self.shared = settings.shared
        self.budget = settings.budget
        self.policy = settings.policy
        self.stats = EngineStats()
        self.limiter = AdaptiveLimit(
            settings.concurrency, settings.initial_limit, tolerance=settings.throttle_tolerance
        )
        self.stats.limit_min = self.limiter.limit
        self.pacer = RatePacer(settings.rpm, settings.tpm)
        self.gate = Gate(settings.concurrency)
        refusals = settings.refusals
        if refusals is None and settings.fail_fast_after > 0:
            refusals = RefusalWatch(settings.fail_fast_after, self.format)
        self.refusals = refusals
        self.timeout = aiohttp.ClientTimeout(total=self.policy.request_timeout_s)
        self.base_headers = {
            **self.format.auth_headers(settings.api_key),
            "Content-Type": "application/json",
            "User-Agent": settings.user_agent,
        }
        self.base_url = settings.base_url
        # a family whose URL names the model: the cache is keyed by the path with the model in it
        self.routed = self.format.model_in_url
        self.url_cache: dict[str, URL] = {}
        self.request = session.request
        self.sink = sink
        self.should_stop = settings.should_stop
        self.sleep = settings.sleep
        self.rand = settings.rand
        self.taken = 0
        self.stopping = False
        self.exhausted = False
        # the workers awaiting an answer, and those given up once the provider refused the run
        self.sending: set[asyncio.Task[Any]] = set()
        self.abandoned: set[asyncio.Task[Any]] = set()
        self.time_left = settings.time_left

    def url_for(self, path: str) -> URL:
        url = self.url_cache.get(path)
        if url is None:
            # as the family encoded it: a signature covers the path as it is sent
            url = URL(self.format.url(self.base_url, path), encoded=self.routed)
            if len(self.url_cache) < _URL_CACHE_MAX:
                self.url_cache[path] = url
        return url

    async def send(self, req: Request, held: list[bool]) -> Outcome:
        """One request to its Outcome: attempt, classify, and act on the verdict until it is final.

        Longer than 80 lines on purpose: the one flat retry loop every attempt of every request
        runs, with its state in locals (`bench/engine.py` measures it); split, each attempt would
        pay calls and attribute lookups that the reference clients do not."""
        stats = self.stats
        limiter = self.limiter
        pacer = self.pacer
        shared = self.shared
        ticket: Ticket | None = None
        policy = self.policy
        # the model refused the tier for an earlier request of the run: this one goes at standard
        tier = req.tier if self.stats.tier_refused is None else ""
        url, body = self.addressed(req, tier)
        timeout = self.timeout
        headers = {**self.base_headers, "x-sluice-custom-id": req.custom_id}
        sign = self.sign
        attempt = 0
        throttled = 0
        # the other failed attempts, by cause: [a 5xx answer, a connection lost or timed out]
        failed = [0, 0]
        unavailable = 0
        started = 0.0
        while True:
            attempt += 1
            token = await limiter.acquire(attempt > 1)
            status: int | None = None
            raw = b""
            answer: Mapping[str, str] | None = None
            lost: str | None = None
            try:
                if pacer.active:
                    await pacer.take(req.estimated_tokens)
                if shared is not None:
                    ticket = await shared.take(req)
                if attempt == 1:
                    started = time.monotonic()
                stats.attempts += 1
                if sign is not None:
                    # each attempt anew: a signature is dated, and a retry may come minutes later
                    with causes.because(causes.SIGNED):
                        headers = sign(req.method, str(url), headers, body)
                if tier:
                    timeout = aiohttp.ClientTimeout(total=tier_timeout_s(policy, self.time_left()))
                async with self.request(req.method, url, data=body, headers=headers, timeout=timeout) as resp:
                    status = resp.status
                    answer = resp.headers
                    raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                # a status with no body (reset mid-read) still counts as a lost connection
                status = None
                lost = describe_lost(exc)
                stats.connection_errors += 1
            finally:
                limiter.release()
            if shared is not None:
                if ticket is not None:
                    shared.observe(ticket, status, answer, throttle_said(status, raw, self.format))
            elif answer is not None:
                # Without the shared limit, the provider's own word paces the shard: a spent quota
                # pauses it until the reset. With it, the shared bucket paces, and such a pause
                # (OpenAI's reset is until the bucket is full again, a minute) would idle a shard
                # that holds a lease.
                pacer.observe_headers(answer, self.format)

            verdict = classify(
                status,
                answer,
                raw,
                lost,
                attempt=attempt,
                policy=policy,
                request_format=self.format,
                now=time.time(),
                rand=self.rand,
            )
            if verdict.kind == OK:
                limiter.on_success(token)
                if shared is not None and ticket is not None:
                    shared.settle(ticket, verdict.body)
                if tier != req.tier:
                    stats.tier_fallbacks += 1
                outcome = self.finish_ok(req, verdict, status, answer, attempt, started, throttled, tier)
                outcome.server_errors, outcome.lost = failed
                return outcome
            if tier and (verdict.tier_refused or (verdict.tier_unavailable and falls_back(unavailable + 1, policy))):
                # at once: the standard tier is another queue, which this one's wait says nothing of
                if verdict.tier_refused and stats.tier_refused is None:
                    stats.tier_refused = verdict.message
                tier = ""
                timeout = self.timeout
                url, body = self.addressed(req, tier)
                stats.retries += 1
                continue
            unavailable += verdict.tier_unavailable
            if verdict.throttled:
                throttled += 1
                if status == 429:
                    stats.throttled_429 += 1
                if limiter.on_throttled(token) and limiter.limit < stats.limit_min:
                    stats.limit_min = limiter.limit
            elif verdict.server_error:
                stats.server_errors += 1
                failed[0] += 1
            elif lost is not None:
                failed[1] += 1
            if verdict.kind == FAIL:
                if tier != req.tier:
                    stats.tier_fallbacks += 1
                outcome = self.finish_error(req, verdict, status, answer, attempt, started, throttled, tier != req.tier)
                outcome.server_errors, outcome.lost = failed
                return outcome
            stats.retries += 1
            if held[0]:
                # a standby worker takes this place while this one sleeps
                held[0] = False
                self.gate.leave()
            await self.sleep(verdict.delay_s)

    def addressed(self, req: Request, tier: ServiceTier) -> tuple[URL, bytes | None]:
        """Where a request goes and the body it is sent, at `tier` ("": the standard tier)."""
        body = req.body
        if tier and body is not None:
            body = self.format.tiered(body, tier)
        if self.routed:
            routed, body = self.format.route(req.path, body)
            return self.url_for(routed), body
        return self.url_for(req.path), body

    def finish_ok(
        self,
        req: Request,
        verdict: AttemptVerdict,
        status: int | None,
        headers: Mapping[str, str] | None,
        attempts: int,
        started: float,
        throttled: int,
        tier: ServiceTier = "",
    ) -> Outcome:
        """An answered request's Outcome, with the provider's id of the answer, its body in the shape
        the line was written in; `tier`: the tier the answer was sent at ("" the standard one)."""
        self.stats.succeeded += 1
        body = verdict.body
        request_id = self.format.request_id(headers, body)
        body = self.format.from_wire(req.path, body, int(time.time()), sent=req.body, request_id=request_id, tier=tier)
        return Outcome(
            line=req.line,
            custom_id=req.custom_id,
            status_code=status,
            body=body,
            request_id=request_id,
            attempts=attempts,
            latency_s=time.monotonic() - started,
            throttled=throttled,
            tier_fallback=tier != req.tier,
        )

    def finish_error(
        self,
        req: Request,
        verdict: AttemptVerdict,
        status: int | None,
        headers: Mapping[str, str] | None,
        attempts: int,
        started: float,
        throttled: int,
        fell_back: bool = False,
    ) -> Outcome:
        code = self.count_error(verdict.code or "")
        return Outcome(
            line=req.line,
            custom_id=req.custom_id,
            status_code=status,
            body=verdict.body,
            request_id=self.format.request_id(headers, None),
            error_code=code,
            error_message=verdict.message,
            attempts=attempts,
            latency_s=time.monotonic() - started,
            throttled=throttled,
            headers=dict(headers) if headers is not None else {},
            tier_fallback=fell_back,
        )

    async def checked(self, check: OutputCheck, req: Request, outcome: Outcome, held: list[bool]) -> Outcome:
        """The line's last outcome: its answer sent again while it fails the job's checks and has
        sends left, each within the budget."""
        failed = list(req.failed_checks)
        attempts = outcome.attempts
        while (again := check.judge(req, outcome, failed)) is not None:
            budget = self.budget
            if budget is not None and not await budget.reserve(again):
                self.stopping = True
                return check.give_up(outcome, failed)
            outcome = await self.send(again, held)
            if budget is not None:
                budget.settle(again, outcome)
            attempts += outcome.attempts
            outcome.attempts = attempts
            req = again
        return outcome

    def refused(self, refused: ProviderRefused | None) -> None:
        """The provider refused the run's first answers alike: take no more requests, and give up
        those still in flight (every one would get the same answer, and a server that cannot keep
        up, its listen queue full, may hold one for the whole request timeout)."""
        self.stopping = True
        self.stats.refused = refused
        for task in self.sending:
            if task is not asyncio.current_task():
                self.abandoned.add(task)
                task.cancel()

    def count_error(self, code: str) -> str:
        self.stats.failed += 1
        self.stats.error_codes[code] = self.stats.error_codes.get(code, 0) + 1
        return code

    def given_up_outcome(self, req: Request) -> Outcome:
        refused = self.stats.refused
        self.stats.given_up += 1
        code = self.count_error(ErrorCode.PROVIDER_REFUSED)
        message = given_up_message(refused) if refused is not None else "given up"
        return Outcome(req.line, req.custom_id, None, None, None, error_code=code, error_message=message)

    async def worker(self, it: Iterator[Request]) -> None:
        gate = self.gate
        held = [False]
        sending = self.sending
        task = asyncio.current_task()
        assert task is not None
        while True:
            if not held[0]:
                await gate.enter()
                held[0] = True
            if self.stopping or self.exhausted:
                break
            if self.should_stop():
                self.stopping = True
                break
            try:
                req = next(it)
            except StopIteration:
                self.exhausted = True
                break
            self.taken += 1
            budget = self.budget
            if budget is not None and not await budget.reserve(req):
                self.stopping = True
                break
            settled = False
            sending.add(task)
            try:
                outcome = await self.send(req, held)
                if budget is not None:
                    budget.settle(req, outcome)
                    settled = True
                if self.settings.output_check is not None:
                    outcome = await self.checked(self.settings.output_check, req, outcome, held)
            except asyncio.CancelledError:
                # given up because the provider refused the run; any other cancel goes on up
                if task not in self.abandoned or task.uncancel() > 0:
                    raise
                outcome = self.given_up_outcome(req)
                if budget is not None and not settled:
                    budget.settle(req, outcome)
            finally:
                sending.discard(task)
            if self.refusals is not None and self.refusals.see(outcome):
                self.refused(self.refusals.refused)
            self.sink(outcome)
        # pass the permit on so a standby worker wakes, sees the end, and exits in turn
        gate.leave()

    async def run(self, it: Iterator[Request]) -> None:
        settings = self.settings
        workers = settings.concurrency + math.ceil(settings.concurrency * max(0.0, settings.retry_headroom))
        keep_read_buffers_off_mmap()
        t0 = time.monotonic()
        try:
            with tuned_gc(settings.tune_gc):
                async with asyncio.TaskGroup() as group:
                    for index in range(workers):
                        group.create_task(self.worker(it))
                        if index % _START_BATCH == _START_BATCH - 1:
                            # Opening a connection costs ~0.3 ms of CPU. Started all at once, 1000
                            # workers would each open theirs before any request leaves; in batches,
                            # the first requests go out while later workers are still connecting.
                            await asyncio.sleep(0)
        except BaseExceptionGroup as group_error:
            # callers want the bug itself, not a group; several workers often trip on the same one
            first = group_error.exceptions[0]
            raise first from (group_error if len(group_error.exceptions) > 1 else None)
        self.stats.sent = self.taken
        self.stats.limit_final = self.limiter.limit
        self.stats.elapsed_s = time.monotonic() - t0
