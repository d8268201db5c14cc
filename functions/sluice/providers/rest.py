"""The JSON-over-HTTP calls of a Batch API Sluice speaks without an SDK (Anthropic's Message
Batches, Gemini's Batch API): one call and its answer, a call that is safe to repeat repeated while
the answer is a throttle, a 5xx or none, and a read that raises when it is refused. What an error
body says is the family's (`RequestFormat.error`), the wait it asks for included."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import orjson

from sluice.core.retry import RetryPolicy, backoff_s, next_delay_s

from .batch import BatchApi, BatchApiOpener, json_record
from .format import ProviderError

# reads, cancels and deletes are safe to repeat: 429, 5xx and lost connections go again
READ_POLICY = RetryPolicy(max_attempts=6, base_delay_s=1.0)
_EXCERPT = 300


class ProviderUnavailable(Exception):
    """The provider's Batch API did not answer usably after every attempt."""


class Answer:
    __slots__ = ("body", "error", "headers", "status")

    def __init__(self, status: int, body: Any, headers: dict[str, str], error: ProviderError) -> None:
        self.status, self.body, self.headers, self.error = status, body, headers, error

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def refusal(self) -> str:
        text = f"HTTP {self.status}"
        if self.error.message:
            text += f": {self.error.message[:_EXCERPT]}"
        return f"{text} ({self.error.code})" if self.error.code else text


class RestCalls:
    """Calls through an open aiohttp session that carries the family's auth; `error` reads the
    family's error bodies."""

    def __init__(self, session: aiohttp.ClientSession, error: Callable[[Any], ProviderError]) -> None:
        self._session = session
        self._error = error

    async def _once(
        self,
        method: str,
        url: str,
        *,
        data: bytes | bytearray | None = None,
        headers: Mapping[str, str] | None = None,
        **options: Any,
    ) -> Answer:
        if headers is None and data is not None:
            headers = {"content-type": "application/json"}
        async with self._session.request(method, url, data=data, headers=headers, **options) as response:
            raw = await response.read()
            try:
                body = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                body = raw.decode(errors="replace")
            error = self._error(body) if not 200 <= response.status < 300 else ProviderError()
            return Answer(response.status, body, dict(response.headers), error)

    async def _call(self, method: str, url: str, **options: Any) -> Answer:
        """A call that is safe to repeat, repeated while the answer is a throttle, a 5xx or none."""
        attempt = 0
        while True:
            attempt += 1
            try:
                answer = await self._once(method, url, **options)
            except (aiohttp.ClientError, TimeoutError) as exc:
                if attempt >= READ_POLICY.max_attempts:
                    raise ProviderUnavailable(f"{method} {url}: {exc!r}") from exc
                await asyncio.sleep(backoff_s(attempt, READ_POLICY, random.random))
                continue
            if answer.ok or answer.status not in READ_POLICY.retryable_statuses or attempt >= READ_POLICY.max_attempts:
                return answer
            asked = answer.error.retry_after_s
            await asyncio.sleep(
                next_delay_s(attempt, READ_POLICY, answer.headers, time.time(), random.random, asked_s=asked)
            )

    async def _get(self, url: str, **options: Any) -> Any:
        answer = await self._call("GET", url, **options)
        if not answer.ok:
            raise ProviderUnavailable(f"GET {url}: {answer.refusal()}")
        return answer.body

    async def _records(self, url: str, **options: Any) -> AsyncGenerator[dict[str, Any], None]:
        """The records of the JSONL file at `url` (`json_record`), read as it streams."""
        async with self._session.get(url, **options) as response:
            if response.status >= 300:
                raise ProviderUnavailable(f"GET {url}: HTTP {response.status}")
            pending = b""
            async for chunk in response.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if (record := json_record(line)) is not None:
                        yield record
            if (record := json_record(pending)) is not None:
                yield record


def opener_of(
    api: Callable[[aiohttp.ClientSession], BatchApi], headers: Mapping[str, str], *, timeout_s: float
) -> BatchApiOpener:
    """Opens the `api` a family's `RestCalls` make for each run, on its own session carrying the
    family's auth `headers`, closed when the run ends."""

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[BatchApi]:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout_s, sock_read=timeout_s)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
            yield api(session)

    return opened
