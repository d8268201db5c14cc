"""A small Converse-compatible server on 127.0.0.1, independent of Sluice (issue 42): it imports
nothing of `sluice` or `local`, and answers `POST /model/{modelId}/converse` in Amazon Bedrock's
Converse shape (output.message.content[].text, stopReason, usage.inputTokens/outputTokens/
totalTokens, metrics.latencyMs) with its own words, so a run's results show whose answers they are.

It takes only SigV4-signed requests (an `Authorization: AWS4-HMAC-SHA256 Credential=...` header,
service `bedrock`), as Bedrock does; it does not verify the signature (it has no secret), but
records the access key id each request was signed with.

    .venv/bin/python bench/converse_server.py --port 8765
    AWS_ENDPOINT_URL_BEDROCK_RUNTIME=http://127.0.0.1:8765 AWS_ACCESS_KEY_ID=AKIDEXAMPLE \\
      AWS_SECRET_ACCESS_KEY=secret .venv/bin/sluice run examples/reviews.jsonl --provider bedrock \\
      --model anthropic.claude-3-haiku-20240307-v1:0 --out out
"""

from __future__ import annotations

import argparse
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

ANSWER_PREFIX = "converse-server answers: "
_CREDENTIAL = re.compile(r"Credential=([^/]+)/\d{8}/([^/]+)/([^/]+)/aws4_request")


@dataclass
class ConverseServer:
    requests: int = 0
    models: Counter[str] = field(default_factory=Counter)
    access_keys: Counter[str] = field(default_factory=Counter)
    regions: Counter[str] = field(default_factory=Counter)
    base_url: str = ""
    _runner: web.AppRunner | None = None

    async def converse(self, request: web.Request) -> web.Response:
        signed = _CREDENTIAL.search(request.headers.get("Authorization", ""))
        if signed is None or signed.group(3) != "bedrock":
            return web.json_response({"message": "Missing Authentication Token"}, status=403)
        body: dict[str, Any] = await request.json()
        self.requests += 1
        self.models[request.match_info["model"]] += 1
        self.access_keys[signed.group(1)] += 1
        self.regions[signed.group(2)] += 1
        said = " ".join(
            part.get("text", "")
            for message in body.get("messages", [])
            for part in message.get("content", [])
            if isinstance(part, dict)
        )
        words = len(said.split())
        text = f"{ANSWER_PREFIX}{words} words received"
        return web.json_response(
            {
                "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
                "stopReason": "end_turn",
                "usage": {"inputTokens": words + 3, "outputTokens": 5, "totalTokens": words + 8},
                "metrics": {"latencyMs": 1},
            }
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/model/{model}/converse", self.converse)
        return app

    async def start(self, port: int = 0) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class InThread:
    """The server on a thread of its own, for a test or a bench that runs `sluice run` beside it."""

    def __init__(self) -> None:
        self.server = ConverseServer()
        self._ready = threading.Event()
        self._loop: Any = None
        self._thread = threading.Thread(target=self._serve, name="converse-server", daemon=True)

    def _serve(self) -> None:
        import asyncio

        loop = asyncio.new_event_loop()
        self._loop = loop
        loop.run_until_complete(self.server.start())
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self.server.stop())
        loop.close()

    def __enter__(self) -> ConverseServer:
        self._thread.start()
        self._ready.wait(timeout=30)
        return self.server

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = ConverseServer()
    print(json.dumps({"listening": f"http://127.0.0.1:{args.port}"}), flush=True)
    web.run_app(server.app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
