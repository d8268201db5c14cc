"""Anthropic's Message Batches as a `BatchApi`, over aiohttp (the family's direct mode needs no
SDK, and this one needs nothing the SDK would add but its import time): a batch's requests sent
inline (`POST /v1/messages/batches`, up to 100,000 requests or 256 MB), its status read, its
results streamed from `results_url` in any order, cancelled, and deleted once collected.

Each request goes under an id Sluice makes (`batch_wire`): Anthropic's ids are restricted, and
the runners map a row back to the user's own `custom_id` through the part's row map. A chat line's
params are its body translated to Messages (`translate`), its answer translated back.

Message Batches carry no metadata, so what a lost answer hid is harder to find than OpenAI's:
- creating a batch whose answer was lost (a dropped connection, a 5xx): the batches listed since
  the call began that were not listed before it and hold as many requests as the file are the
  candidates; exactly one is taken as the file's batch, none means the file goes again, and
  more than one (another shard created a file of the same size at the same moment) raises,
  rather than guess, and the step's retry looks again;
- `find` (a run that died between creating a batch and recording it) recognises a batch that has
  ended by the ids in its results, which name the shard, part and attempt, and a batch this
  process created; a batch still running whose creation was never recorded cannot be told from
  another's, so its file goes again and both are paid for. The window is one Lambda's death
  between two calls;
- `listed` tags only the batches this process created (a tag names the job, and a request id has
  no room for it), so the queue's reconciliation (`batch_queue`), which frees the holds of shards
  whose tagged batches ended long ago, frees none from Anthropic's list: a dead shard's hold
  lasts until it times out, and the queue is under-used meanwhile, never over-filled.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Any
from urllib.parse import urljoin

import aiohttp

from sluice.contract.model import Request
from sluice.core.retry import RetryPolicy, backoff_s, next_delay_s

from ..batch import (
    CLOCK_SLACK_S,
    CREATE_JITTER_FLOOR,
    BatchApiOpener,
    BatchLimits,
    BatchRow,
    BatchState,
    BatchStatus,
    BatchTag,
    BatchUpload,
    CancelRefused,
    QueueFull,
    file_of,
)
from ..rest import ProviderUnavailable, RestCalls, opener_of
from .batch_wire import batch_status, kind_of, line_ref, parse_row, row_prefix, tag_of
from .format import ANTHROPIC, OVERLOADED_STATUS

# Anthropic's limits for one batch (docs.anthropic.com, Message Batches)
MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1024 * 1024
# `submit` prefixes each request's id with its batch's tag (at most this many bytes) after the
# runners cut the file by its size
_TAG_ROOM = 32
BATCHES_PATH = "/v1/messages/batches"
# creating is not (no idempotency key): only a refusal that created nothing goes again at once
CREATE_POLICY = RetryPolicy(max_attempts=5, base_delay_s=1.0)
QUEUE_FULL_STATUS = 429
_REFUSED = frozenset({QUEUE_FULL_STATUS, OVERLOADED_STATUS})
# a 256 MB request needs far longer than one inference call
CREATE_TIMEOUT_S = 600.0
PAGE = 100
_ROW_START = b'{"custom_id":"'


def batch_row(request: Request) -> bytes:
    """The request as one inline request, `params` its body, which is a Messages body already (a chat
    or Responses line's was translated as it was read, `RequestFormat.to_wire`, and translating it
    again would read it as the line's own shape); its id is the line, which `submit` prefixes with the
    batch's tag."""
    custom_id = line_ref(request.line) + kind_of(request.path)
    return b'%s%s","params":%s}\n' % (_ROW_START, custom_id.encode(), request.body or b"{}")


def _requests_body(upload: BatchUpload, tag: BatchTag) -> bytearray:
    """The create request's body: the file's rows, each id prefixed with the tag, written into one
    buffer as the file is read, so a 256 MB batch costs its body and no copies of it."""
    file = file_of(upload)
    prefixed = _ROW_START + row_prefix(tag).encode()
    body = bytearray(b'{"requests":[')
    for row in file:
        if not row.strip():
            continue
        if len(body) > len(b'{"requests":['):
            body += b","
        body += prefixed
        body += row.rstrip(b"\n").removeprefix(_ROW_START)
    body += b"]}"
    return body


class AnthropicBatchApi(RestCalls):
    """`BatchApi` over Message Batches, through an open aiohttp session carrying the family's auth."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, limits: BatchLimits) -> None:
        super().__init__(session, ANTHROPIC.error)
        root = base_url.rstrip("/")
        self._url = root.removesuffix("/v1") + BATCHES_PATH
        # a `results_url` may be relative (a gateway's, a proxy's): it is read against the base
        self._base = root + "/"
        self._limits = limits
        # the batches this process created, by id: `find` knows them while they still run
        self._created: dict[str, BatchTag] = {}

    @property
    def limits(self) -> BatchLimits:
        return self._limits

    def encode(self, request: Request) -> bytes:
        return batch_row(request)

    def row_ref(self, line: int, custom_id: str) -> str:
        return line_ref(line)

    async def _each_since(self, since: float) -> AsyncIterator[dict[str, Any]]:
        """The key's batches, newest first, down to the first created before `since`."""
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": PAGE}
            if after:
                params["after_id"] = after
            page = await self._get(self._url, params=params)
            data = page.get("data") if isinstance(page, dict) else None
            for batch in data if isinstance(data, list) else []:
                if not isinstance(batch, dict):
                    continue
                if batch_status(batch).created_at < since:
                    return
                yield batch
            after = page.get("last_id") if isinstance(page, dict) else None
            if not (isinstance(page, dict) and page.get("has_more") and after):
                return

    async def _first_id(self, status: BatchStatus) -> str | None:
        """The id of any one request of an ended batch, from its results."""
        if not status.output_file:
            return None
        # closed at once: the rest of the results is not read
        async with contextlib.aclosing(self._records(urljoin(self._base, status.output_file))) as records:
            async for record in records:
                custom_id = record.get("custom_id")
                if isinstance(custom_id, str):
                    return custom_id
        return None

    async def find(self, job: str, shard: int, since: float) -> dict[BatchTag, str]:
        found: dict[BatchTag, str] = {}
        async for batch in self._each_since(since):
            status = batch_status(batch)
            tag = self._created.get(status.id)
            if tag is None and status.ended:
                first = await self._first_id(status)
                tag = tag_of(first, job, shard) if first else None
            if tag is not None and tag.job == job and tag.shard == shard:
                # newest first: an older copy of a tag replaces a newer one
                found[tag] = status.id
        return found

    async def listed(self, since: float) -> list[BatchStatus]:
        listed = []
        async for batch in self._each_since(since):
            status = batch_status(batch)
            tag = self._created.get(status.id)
            listed.append(status if tag is None else _tagged(status, tag))
        return listed

    async def _newest(self, since: float) -> set[str]:
        return {str(batch.get("id")) async for batch in self._each_since(since)}

    async def _created_since(self, before: set[str], since: float, rows: int) -> list[str]:
        found = []
        async for batch in self._each_since(since):
            status = batch_status(batch)
            if status.id not in before and status.counts.total == rows:
                found.append(status.id)
        return found

    async def submit(self, upload: BatchUpload, tag: BatchTag) -> str:
        body = _requests_body(upload, tag)
        started = time.time()
        window = started - CLOCK_SLACK_S
        before = await self._newest(window)
        tries = 0
        while True:
            tries += 1
            failure: str
            try:
                answer = await self._once(
                    "POST", self._url, data=body, timeout=aiohttp.ClientTimeout(total=CREATE_TIMEOUT_S)
                )
            except (aiohttp.ClientError, TimeoutError) as exc:
                answer, failure = None, repr(exc)
            if answer is not None:
                if answer.ok and isinstance(answer.body, dict) and answer.body.get("id"):
                    batch_id = str(answer.body["id"])
                    self._created[batch_id] = tag
                    return batch_id
                failure = answer.refusal()
                if answer.status in _REFUSED:
                    # refused before anything was created. A 429 is the batch queue (or the key's
                    # rate) full: the runner's requeue waits far longer than a Lambda should sleep
                    if answer.status == QUEUE_FULL_STATUS or tries >= CREATE_POLICY.max_attempts:
                        raise QueueFull(failure)
                    await asyncio.sleep(next_delay_s(tries, CREATE_POLICY, answer.headers, time.time(), random.random))
                    continue
                if answer.status < 500:
                    raise ProviderUnavailable(f"creating a batch: {failure}")
            # no answer, or a 5xx: the batch may exist
            candidates = await self._created_since(before, window, upload.rows)
            if len(candidates) == 1:
                self._created[candidates[0]] = tag
                return candidates[0]
            if candidates:
                raise ProviderUnavailable(
                    f"creating a batch: {failure}; {len(candidates)} batches of {upload.rows} requests appeared "
                    "meanwhile and none can be told to be this one"
                )
            if tries >= CREATE_POLICY.max_attempts:
                raise ProviderUnavailable(f"creating a batch: {failure}")
            await asyncio.sleep(backoff_s(tries, CREATE_POLICY, random.random, floor=CREATE_JITTER_FLOOR))

    async def status(self, batch_id: str) -> BatchStatus:
        status = batch_status(await self._get(f"{self._url}/{batch_id}"))
        tag = self._created.get(batch_id)
        return status if tag is None else _tagged(status, tag)

    async def rows(self, status: BatchStatus) -> AsyncIterator[BatchRow]:
        if not status.output_file:
            return
        created = int(status.ended_at or time.time())
        async for record in self._records(urljoin(self._base, status.output_file)):
            row = parse_row(record, created)
            if row is not None:
                yield row

    async def cancel(self, batch_id: str) -> BatchStatus:
        try:
            answer = await self._call("POST", f"{self._url}/{batch_id}/cancel")
            failure = None if answer.ok else answer.refusal()
        except ProviderUnavailable as exc:
            answer, failure = None, str(exc)
        if answer is not None and answer.ok and isinstance(answer.body, dict):
            return batch_status(answer.body)
        try:
            now: BatchStatus | None = await self.status(batch_id)
        except ProviderUnavailable:
            now = None
        raise CancelRefused(failure or "the provider gave no batch", now)

    async def staged(self, tag: BatchTag, endpoint: str) -> bool:
        # a message batch carries its requests inline: there is no file to keep
        return False

    async def clean_up(self, statuses: Iterable[BatchStatus]) -> None:
        for status in statuses:
            if status.state in (BatchState.IN_PROGRESS, BatchState.CANCELLING):
                continue
            with contextlib.suppress(ProviderUnavailable, aiohttp.ClientError, TimeoutError):
                await self._call("DELETE", f"{self._url}/{status.id}")


def _tagged(status: BatchStatus, tag: BatchTag) -> BatchStatus:
    return replace(status, tag=tag)


def within_limits(limits: BatchLimits | None = None) -> BatchLimits:
    """`limits` (None: Anthropic's) kept within Anthropic's own, with room for the tags `submit` adds."""
    chosen = limits or BatchLimits(max_records=MAX_REQUESTS, max_bytes=MAX_BYTES)
    return replace(
        chosen,
        max_records=min(chosen.max_records, MAX_REQUESTS),
        max_bytes=min(chosen.max_bytes, MAX_BYTES - _TAG_ROOM * MAX_REQUESTS),
    )


def opener(base_url: str, api_key: str, *, timeout_s: float, limits: BatchLimits | None = None) -> BatchApiOpener:
    """Opens an `AnthropicBatchApi` on its own session for each run, closed when the run ends;
    `limits` are kept within Anthropic's own."""
    chosen = within_limits(limits)
    return opener_of(
        lambda session: AnthropicBatchApi(session, base_url, chosen),
        ANTHROPIC.auth_headers(api_key),
        timeout_s=timeout_s,
    )
