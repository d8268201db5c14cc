"""The engine on a family whose URL names the model and whose requests are signed (Bedrock): each
request goes to its model's URL without the model in its body, and every attempt is signed anew."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web
from sluice.contract.model import Outcome, Request
from sluice.core.retry import RetryPolicy
from sluice.formats.lines import parse_line
from sluice.providers import BEDROCK
from sluice.send.engine import EngineSettings, fan_out, make_session

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
ANSWER = {
    "output": {"message": {"role": "assistant", "content": [{"text": "positive"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 5, "outputTokens": 1, "totalTokens": 6},
}


def line(custom_id: str) -> Request:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "I loved it"}]}
    raw = orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})
    parsed = parse_line(raw, 1, request_format=BEDROCK)
    assert isinstance(parsed, Request)
    return parsed


def test_a_signed_family_sends_to_the_models_url_and_signs_every_attempt() -> None:
    seen: list[dict[str, Any]] = []
    signed: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append({"path": request.raw_path, "headers": dict(request.headers), "body": await request.read()})
        if len(seen) == 1:
            headers = {"x-amzn-ErrorType": "ThrottlingException"}
            return web.json_response({"message": "Too many requests"}, status=429, headers=headers)
        return web.json_response(ANSWER, headers={"x-amzn-RequestId": "rid-1"})

    def sign(method: str, url: str, headers: Mapping[str, str], body: bytes | None) -> dict[str, str]:
        signed.append(url)
        return {**headers, "Authorization": f"AWS4-HMAC-SHA256 attempt {len(signed)}"}

    async def go() -> list[Outcome]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        outcomes: list[Outcome] = []

        async def no_sleep(_: float) -> None:
            await asyncio.sleep(0)

        try:
            async with make_session(2) as session:
                stats = await fan_out(
                    [line("a")],
                    session=session,
                    settings=EngineSettings(
                        concurrency=2,
                        policy=RetryPolicy(max_attempts=3),
                        request_format=BEDROCK,
                        base_url=f"http://127.0.0.1:{runner.addresses[0][1]}",
                        sleep=no_sleep,
                        sign=sign,
                    ),
                    sink=outcomes.append,
                )
        finally:
            await runner.cleanup()
        assert stats.throttled_429 == 1 and stats.retries == 1
        return outcomes

    (outcome,) = asyncio.run(go())
    path = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"
    assert [s["path"] for s in seen] == [path, path]
    assert len(signed) == 2 and all(url.endswith(path) for url in signed)
    assert [s["headers"]["Authorization"] for s in seen] == ["AWS4-HMAC-SHA256 attempt 1", "AWS4-HMAC-SHA256 attempt 2"]
    assert "model" not in orjson.loads(seen[0]["body"])
    assert outcome.ok and outcome.request_id == "rid-1"
    assert outcome.body["model"] == MODEL and outcome.body["id"] == "rid-1"
    assert outcome.body["choices"][0]["message"]["content"] == "positive"
