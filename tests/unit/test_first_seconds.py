"""The engine's first seconds against a provider that sends no rate headers (issue 31): errors and
timeouts do not hold it to one request at a time, a vLLM-like server gets the configured
concurrency from the start, and a run whose first answers are all one refusal stops sending."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from sluice.contract.model import ErrorCode, Outcome, Request
from sluice.core.retry import RetryPolicy
from sluice.limits.shared import SharedLimit
from sluice.limits.table import BucketTable
from sluice.providers import OPENAI
from sluice.send.engine import EngineSettings, EngineStats, fan_out, make_session
from sluice.send.refusal import OUTAGE_S, REFUSAL_ANSWERS, RefusalWatch, likely_cause

from tests.unit.helpers.shared_limit_scale import RecordingTable

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02, request_timeout_s=0.2)
NOT_FOUND = {"error": {"message": "Invalid URL (POST /wrong/v1/chat/completions)", "type": "invalid_request_error"}}


@dataclass
class Provider:
    """Answers every request after `delay_s` with `status`, `body` and `headers` (no rate headers
    unless told); counts the requests in flight, and how many were in flight before the first
    answer went back."""

    status: int = 200
    body: dict[str, Any] = field(default_factory=lambda: {"id": "x", "choices": [], "usage": {"total_tokens": 2}})
    delay_s: float = 0.05
    # a status to answer one custom id with instead, to break a run of refusals
    exceptions: dict[str, int] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    before_first_answer: int = 0
    answered: int = 0
    requests: int = 0
    base_url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.answered == 0:
            self.before_first_answer = max(self.before_first_answer, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        self.answered += 1
        status = self.exceptions.get(request.headers.get("x-sluice-custom-id", ""), self.status)
        return web.Response(
            status=status, body=orjson.dumps(self.body), content_type="application/json", headers=self.headers
        )


@asynccontextmanager
async def serve(provider: Provider) -> AsyncIterator[Provider]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", provider.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    provider.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    try:
        yield provider
    finally:
        await runner.cleanup()


def chat(i: int) -> Request:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]})
    return Request(line=i + 1, custom_id=f"r{i}", method="POST", path="/v1/chat/completions", body=body)


def run(
    provider: Provider,
    lines: int,
    *,
    concurrency: int = 20,
    policy: RetryPolicy = FAST,
    fail_fast_after: int = 0,
    shared: Callable[[], SharedLimit] | None = None,
    refusals: RefusalWatch | None = None,
) -> tuple[EngineStats, list[Outcome]]:
    outcomes: list[Outcome] = []

    async def go() -> EngineStats:
        async with serve(provider), make_session(concurrency) as session:
            limit = shared() if shared is not None else None
            try:
                return await fan_out(
                    [chat(i) for i in range(lines)],
                    session=session,
                    settings=EngineSettings(
                        concurrency=concurrency,
                        policy=policy,
                        fail_fast_after=fail_fast_after,
                        base_url=provider.base_url,
                        api_key="sk-test",
                        shared=limit,
                        refusals=refusals,
                    ),
                    sink=outcomes.append,
                )
            finally:
                if limit is not None:
                    await limit.close()

    stats = asyncio.run(asyncio.wait_for(go(), timeout=60))
    return stats, outcomes


def shared_limit() -> SharedLimit:
    """The shared limit on, with no seed: nothing says the rate before an answer does."""
    return SharedLimit(
        BucketTable(RecordingTable(time.time)),
        base_url="http://p/v1",
        api_key="sk-x",
        lessee="job#0",
        request_format=OPENAI,
    )


def test_errors_without_rate_headers_do_not_hold_the_run_to_one_request() -> None:
    provider = Provider(status=404, body=NOT_FOUND)
    stats, outcomes = run(provider, 60, shared=shared_limit)
    assert len(outcomes) == 60 and all(o.error_code == ErrorCode.PROVIDER_ERROR for o in outcomes)
    # the configured concurrency from the first request on, not one at a time
    assert provider.before_first_answer == 20 and provider.max_in_flight == 20
    # and a refusal is not congestion: the concurrency never shrank
    assert stats.limit_min == 20 and stats.limit_final == 20


@pytest.mark.slow
def test_timeouts_without_rate_headers_do_not_hold_the_run_to_one_request() -> None:
    provider = Provider(delay_s=1.0)
    stats, outcomes = run(provider, 40, shared=shared_limit)
    assert all(o.error_code == ErrorCode.RETRIES_EXHAUSTED for o in outcomes) and len(outcomes) == 40
    assert provider.before_first_answer == 20
    assert stats.attempts == 80 and stats.limit_min == 20


@pytest.mark.slow
def test_a_server_without_rate_headers_gets_the_configured_concurrency_at_once() -> None:
    """A vLLM-like server: 200 without x-ratelimit-* headers; every worker sends before the first
    answer comes back."""
    provider = Provider(delay_s=0.2)
    stats, _ = run(provider, 100, shared=shared_limit, policy=RetryPolicy(request_timeout_s=5.0))
    assert stats.succeeded == 100
    assert provider.before_first_answer == 20


def test_a_run_whose_first_answers_all_refuse_stops_sending() -> None:
    provider = Provider(status=404, body=NOT_FOUND, delay_s=0.01)
    stats, outcomes = run(provider, 2_000, concurrency=10, fail_fast_after=REFUSAL_ANSWERS)
    assert stats.refused is not None
    assert stats.refused.status == 404
    assert stats.refused.message == NOT_FOUND["error"]["message"]
    assert stats.refused.cause.startswith("wrong URL path")
    # the refusals and the requests in flight when they were counted; the rest is left unsent
    assert REFUSAL_ANSWERS <= provider.requests <= REFUSAL_ANSWERS + 10
    assert stats.stopped_early and stats.remaining == 2_000 - stats.sent
    assert len(outcomes) == stats.sent


@pytest.mark.slow
def test_a_success_among_the_first_answers_keeps_the_run_going() -> None:
    provider = Provider(status=400, body=NOT_FOUND, delay_s=0.0, exceptions={"r5": 200})
    stats, outcomes = run(provider, 200, concurrency=1, fail_fast_after=REFUSAL_ANSWERS)
    assert stats.refused is None and not stats.stopped_early
    assert len(outcomes) == 200


def _refusal(status: int, message: str, line: int = 1) -> Outcome:
    body = {"error": {"message": message, "type": "invalid_request_error"}}
    return Outcome(line, f"r{line}", status, body, None, ErrorCode.PROVIDER_ERROR, f"HTTP {status}: {message}")


def test_the_watch_trips_only_on_the_same_refusal_every_time() -> None:
    watch = RefusalWatch(3, OPENAI)
    assert not watch.see(_refusal(404, "no such path"))
    assert not watch.see(_refusal(404, "no such path"))
    assert watch.see(_refusal(404, "no such path"))
    assert watch.refused is not None and watch.refused.status == 404
    # two different messages: a problem of the lines, not of the provider
    mixed = RefusalWatch(3, OPENAI)
    for outcome in (_refusal(400, "line one is bad"), _refusal(400, "line two is bad"), _refusal(400, "x")):
        assert not mixed.see(outcome)
    assert mixed.refused is None
    # a success ends the watch
    answered = RefusalWatch(2, OPENAI)
    assert not answered.see(_refusal(404, "no such path"))
    assert not answered.see(Outcome(2, "r2", 200, {"choices": []}, None))
    assert not answered.see(_refusal(404, "no such path")) and answered.refused is None


def test_outcomes_that_say_nothing_of_the_provider_neither_count_nor_end_the_watch() -> None:
    """Issue 42: a connection lost or a timeout to the last attempt, or 429s to the end, among the
    first answers: the decision is the same whichever request answers first."""
    watch = RefusalWatch(2, OPENAI)
    lost = Outcome(1, "r1", None, None, None, ErrorCode.RETRIES_EXHAUSTED, "gave up after 3 attempts; last: reset")
    busy = Outcome(2, "r2", 429, None, None, ErrorCode.RETRIES_EXHAUSTED, "gave up after 3 attempts; last: HTTP 429")
    assert not watch.see(lost) and not watch.see(_refusal(404, "no such path", 3)) and not watch.see(busy)
    assert watch.see(_refusal(404, "no such path", 4))


def _bare_500(line: int, attempts: int = 3) -> Outcome:
    message = f"gave up after {attempts} attempts; last: HTTP 500"
    return Outcome(line, f"r{line}", 500, "", None, ErrorCode.RETRIES_EXHAUSTED, message)


def test_a_5xx_on_every_attempt_is_a_refusal_once_it_has_lasted() -> None:
    """A provider (or a proxy before it) that answers a bare 500 to every attempt of every request:
    a refusal, once it has lasted OUTAGE_S (a shorter outage is what the last sweep is for)."""
    now = [0.0]
    watch = RefusalWatch(2, OPENAI, clock=lambda: now[0])
    assert not watch.see(_bare_500(1)) and not watch.see(_bare_500(2, attempts=2))
    now[0] = OUTAGE_S - 0.1
    assert not watch.see(_bare_500(3))
    now[0] = OUTAGE_S
    assert watch.see(_bare_500(4))
    assert watch.refused is not None
    assert (watch.refused.status, watch.refused.message) == (500, "")
    assert watch.refused.cause.startswith("server error")


@dataclass
class Holding(Provider):
    """Refuses every request with a 404 at once, except those it holds: never answered while the
    run lasts (a server whose listen queue is full does so until TCP's retransmission gets through)."""

    hold: set[str] = field(default_factory=set)
    held: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("x-sluice-custom-id", "") in self.hold:
            self.held += 1
            await asyncio.sleep(3600)
        return await super().handle(request)


def test_requests_in_flight_when_the_run_is_refused_are_given_up_not_waited_for() -> None:
    """Issue 42: the run ended with its slowest request in flight, up to the request timeout (120 s)
    after the refusal was clear. Now those in flight end at once, each an error `provider_refused`."""
    provider = Holding(status=404, body=NOT_FOUND, delay_s=0.0, hold={f"r{i}" for i in range(5)})
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02, request_timeout_s=5.0)
    stats, outcomes = run(provider, 500, concurrency=10, policy=policy, fail_fast_after=REFUSAL_ANSWERS)
    assert stats.refused is not None and provider.held == 5
    given_up = [o for o in outcomes if o.error_code == ErrorCode.PROVIDER_REFUSED]
    # the held ones, and any refusal still on its way back when the watch tripped
    assert {f"r{i}" for i in range(5)} <= {o.custom_id for o in given_up}
    assert stats.given_up == len(given_up) <= 10
    assert all((o.error_message or "").startswith("given up unanswered") for o in given_up)
    assert all(o.status_code is None for o in given_up)
    # every request taken has its outcome: the given-up ones and the refusals
    assert len(outcomes) == stats.sent and stats.remaining == 500 - stats.sent


def test_a_provider_back_within_the_outage_time_is_no_refusal() -> None:
    now = [0.0]
    watch = RefusalWatch(2, OPENAI, clock=lambda: now[0])
    for line in range(1, 10):
        assert not watch.see(_bare_500(line))
    assert not watch.see(Outcome(10, "r10", 200, {"choices": []}, None))
    now[0] = OUTAGE_S + 1
    assert not watch.see(_bare_500(11)) and watch.refused is None


def test_a_run_answered_500_on_every_attempt_stops_sending() -> None:
    provider = Provider(status=500, body={}, delay_s=0.0)
    watch = RefusalWatch(REFUSAL_ANSWERS, OPENAI, outage_s=0.0)
    stats, outcomes = run(provider, 2_000, concurrency=10, fail_fast_after=REFUSAL_ANSWERS, refusals=watch)
    assert stats.refused is not None and stats.refused.status == 500
    assert stats.stopped_early and len(outcomes) == stats.sent < 100


@pytest.mark.parametrize(
    ("status", "code", "message", "cause"),
    [
        (404, None, "Invalid URL (POST /wrong/v1/chat/completions)", "wrong URL path"),
        (404, "model_not_found", "The model `gpt-5-nano` does not exist or you do not have access.", "unknown model"),
        (400, None, "The model `llama-3` does not exist.", "unknown model"),
        (401, "invalid_api_key", "Incorrect API key provided: sk-abc***.", "key refused"),
        (403, None, "Forbidden", "key refused"),
        (422, None, "messages: field required", "request rejected"),
        (400, "invalid_request_error", "'messages' is a required property", "request rejected"),
        (405, None, "Method Not Allowed", "request refused"),
    ],
)
def test_the_likely_cause_in_plain_words(status: int, code: str | None, message: str, cause: str) -> None:
    assert likely_cause(status, code, message).startswith(cause)


def test_a_full_provider_bucket_is_spent_at_once() -> None:
    """The first answer says 1,200 a minute and 1,199 remain: 100 workers of one shard send 1,000
    requests waiting a period (2 s) at most, where a bucket of 10 s of the rate paced 800 of them
    over 40 s. (10 s of the rate stays in the bucket for the lessees' shares.)"""
    now = [1_000.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds
        await asyncio.sleep(0)

    limit = SharedLimit(
        BucketTable(RecordingTable(lambda: now[0]), clock=lambda: now[0]),
        base_url="http://p/v1",
        api_key="sk-x",
        lessee="job#0",
        request_format=OPENAI,
        clock=lambda: now[0],
        sleep=sleep,
    )
    headers = {"x-ratelimit-limit-requests": "1200", "x-ratelimit-remaining-requests": "1199"}
    sent = 0

    async def worker() -> None:
        nonlocal sent
        for _ in range(10):
            ticket = await limit.take(chat(sent))
            sent += 1
            limit.observe(ticket, 200, headers)

    async def go() -> None:
        first = await limit.take(chat(0))
        limit.observe(first, 200, headers)
        await asyncio.gather(*(worker() for _ in range(100)))
        await limit.close()

    asyncio.run(asyncio.wait_for(go(), timeout=60))
    assert sent == 1_000
    assert limit.waited_s <= 2.0


@pytest.mark.slow
def test_a_spent_quota_in_the_headers_does_not_stop_a_shard_the_shared_limit_paces() -> None:
    """Answers that say 0 of 1,200 remain, full again in 60 s: the shared bucket paces the shard
    at the rate (a lease of 40 a second of it, here), instead of every sender pausing a minute."""
    headers = {
        "x-ratelimit-limit-requests": "1200",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "60s",
    }
    provider = Provider(delay_s=0.01, headers=headers)
    stats, _ = run(provider, 30, policy=RetryPolicy(request_timeout_s=5.0), shared=shared_limit)
    assert stats.succeeded == 30
    assert stats.elapsed_s < 10
