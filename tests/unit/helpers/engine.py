"""What test_engine.py and the tests beside it share."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from sluice.contract.model import Outcome
from sluice.core.retry import RetryPolicy
from sluice.send.engine import EngineSettings, EngineStats, fan_out, make_session

FAST = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05, request_timeout_s=0.5)


# An action is what the server does for one attempt of one custom_id:
#   ("ok",) | ("status", code, headers, json_body) | ("drop",) | ("hang", seconds) | ("raw", code, bytes)
Action = tuple[Any, ...]


def completion(custom_id: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{custom_id}",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


@dataclass
class Scripted:
    """A provider whose answer to attempt k of a custom_id is `script[custom_id][k]` (then ok)."""

    script: dict[str, list[Action]] = field(default_factory=dict)
    default: Callable[[str, int], Action] = lambda _cid, _n: ("ok",)
    log: list[dict[str, Any]] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    base_url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        cid = request.headers.get("x-sluice-custom-id", "")
        n = self.attempts.get(cid, 0)
        self.attempts[cid] = n + 1
        self.log.append(
            {"cid": cid, "path": request.path, "method": request.method, "headers": dict(request.headers), "body": body}
        )
        steps = self.script.get(cid, [])
        action = steps[n] if n < len(steps) else self.default(cid, n)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            kind = action[0]
            if kind == "ok":
                return web.Response(
                    body=orjson.dumps(completion(cid)),
                    content_type="application/json",
                    headers={"x-request-id": f"req-{cid}-{n}"},
                )
            if kind == "status":
                _, code, headers, payload = action
                return web.Response(
                    status=code, body=orjson.dumps(payload), content_type="application/json", headers=headers
                )
            if kind == "raw":
                return web.Response(status=action[1], body=action[2])
            if kind == "drop":
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=200, body=b"never arrives")
            if kind == "hang":
                await asyncio.sleep(action[1])
                return web.Response(body=orjson.dumps(completion(cid)), content_type="application/json")
            raise AssertionError(kind)
        finally:
            self.in_flight -= 1


@asynccontextmanager
async def serve(provider: Scripted, prefix: str = "/v1") -> AsyncIterator[Scripted]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", provider.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    provider.base_url = f"http://127.0.0.1:{port}{prefix}"
    try:
        yield provider
    finally:
        await runner.cleanup()


@dataclass
class Run:
    outcomes: list[Outcome]
    stats: EngineStats
    delays: list[float]


async def run(
    provider: Scripted,
    requests: Any,
    *,
    concurrency: int = 8,
    policy: RetryPolicy = FAST,
    should_stop: Callable[[], bool] = lambda: False,
    sink: Callable[[Outcome], None] | None = None,
) -> Run:
    outcomes: list[Outcome] = []
    delays: list[float] = []

    async def fake_sleep(s: float) -> None:
        delays.append(s)
        await asyncio.sleep(0)

    async with make_session(concurrency) as session:
        stats = await fan_out(
            requests,
            session=session,
            settings=EngineSettings(
                concurrency=concurrency,
                policy=policy,
                base_url=provider.base_url,
                api_key="sk-test",
                should_stop=should_stop,
                sleep=fake_sleep,
                rand=lambda: 0.5,
            ),
            sink=sink or outcomes.append,
        )
    return Run(outcomes, stats, delays)
