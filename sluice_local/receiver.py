"""A webhook receiver on 127.0.0.1 that plays API Gateway: HTTP in, a v2 event to the handler."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from typing import Any

from aiohttp import web


def http_api_event(request: web.Request, body: bytes) -> dict[str, Any]:
    """The API Gateway HTTP API (payload 2.0) event for one request."""
    headers: dict[str, str] = {}
    for name, value in request.headers.items():
        key = name.lower()
        headers[key] = f"{headers[key]},{value}" if key in headers else value
    try:
        text, encoded = body.decode("utf-8"), False
    except UnicodeDecodeError:
        text, encoded = base64.b64encode(body).decode(), True
    return {
        "version": "2.0",
        "routeKey": f"{request.method} {request.path}",
        "rawPath": request.path,
        "rawQueryString": request.query_string,
        "headers": headers,
        "requestContext": {
            "http": {"method": request.method, "path": request.path, "sourceIp": request.remote or ""},
            "timeEpoch": int(time.time() * 1000),
        },
        "body": text,
        "isBase64Encoded": encoded,
    }


class WebhookContext:
    function_name = "sluice-local-webhook"
    aws_request_id = "local"

    def get_remaining_time_in_millis(self) -> int:
        return 10_000


class WebhookReceiver:
    """Runs in its own thread; `url` is what the provider (the simulator) posts to."""

    def __init__(self, handler: Any, *, path: str = "/webhooks", max_body: int = 1 << 20) -> None:
        self._handler = handler
        self._path = path
        self._max_body = max_body
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self.port = 0
        # time from request to answer, and the handler's own share of it
        self.latencies_s: list[float] = []
        self.handler_s: list[float] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self._path}"

    async def _receive(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        body = await request.read()
        event = http_api_event(request, body)
        loop = asyncio.get_running_loop()

        def handle() -> dict[str, Any]:
            began = time.perf_counter()
            try:
                return dict(self._handler(event, WebhookContext()))
            finally:
                self.handler_s.append(time.perf_counter() - began)

        answer = await loop.run_in_executor(None, handle)
        self.latencies_s.append(time.perf_counter() - started)
        return web.Response(
            status=int(answer.get("statusCode", 200)),
            body=answer.get("body", ""),
            headers=answer.get("headers") or {},
        )

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application(client_max_size=self._max_body)
        app.router.add_post(self._path, self._receive)
        self._runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = int(self._runner.addresses[0][1])
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup())
        loop.close()

    def __enter__(self) -> WebhookReceiver:
        threading.Thread(target=self._run, name="sluice-webhooks", daemon=True).start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
