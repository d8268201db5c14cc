"""Gemini's Batch API as a `BatchApi`, over aiohttp, as Google documents its REST shape:
`POST /v1beta/models/{model}:batchGenerateContent` with `batch.inputConfig` holding the part's
requests inline while the request stays under 20 MB, else naming a JSONL file uploaded through the
Files API (a resumable upload, `/upload/v1beta/files`); the batch (`batches/{id}`, a long-running
operation) read until it ends, its answers read from `inlinedResponses` or downloaded from its
responses file (`/download/v1beta/{file}:download?alt=media`) and matched back by each request's key,
cancelled (`:cancel`), and deleted with its files once collected.

The batch's `displayName` carries its tag, so `find` and `listed` know Sluice's batches exactly; a
create whose answer was lost (a dropped connection, a 5xx) looks for its tag among the batches
created since, before it creates again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Any

import aiohttp
import orjson

from sluice.contract.model import Request
from sluice.core.retry import RetryPolicy, backoff_s

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
from ..rest import Answer, ProviderUnavailable, RestCalls, opener_of
from . import batch_wire as wire
from .format import GEMINI
from .translate import model_path

# what one batch request may hold inline; a part past it goes as an uploaded file
INLINE_MAX_BYTES = 20 * 1024 * 1024
# the Files API's largest file
MAX_BYTES = 2 * 1024 * 1024 * 1024
MAX_REQUESTS = 1_000_000
# a batch still pending or running this long after it was created expires
COMPLETION_WINDOW_S = 48 * 3600
VERSION = "/v1beta"
CREATE_POLICY = RetryPolicy(max_attempts=5, base_delay_s=1.0)
QUEUE_FULL_STATUS = 429
CREATE_TIMEOUT_S = 600.0
PAGE = 100
JSONL_MIME = "application/jsonl"


def inline_body(upload: BatchUpload, tag: BatchTag) -> bytearray | None:
    """The create request's body with the part's requests inline; None when it would pass the inline
    limit, so the part goes as a file."""
    file = file_of(upload)
    head = orjson.dumps({"displayName": wire.display_name(tag)})[:-1]
    body = bytearray(b'{"batch":' + head + b',"inputConfig":{"requests":{"requests":[')
    first = True
    for row in file:
        if not row.strip():
            continue
        if not first:
            body += b","
        first = False
        body += wire.inline_item(row)
        if len(body) >= INLINE_MAX_BYTES:
            return None
    body += b"]}}}}"
    return body if len(body) < INLINE_MAX_BYTES else None


class GeminiBatchApi(RestCalls):
    """`BatchApi` over Gemini's Batch and Files APIs, through an open aiohttp session carrying the key."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, limits: BatchLimits) -> None:
        super().__init__(session, GEMINI.error)
        self._root = GEMINI.url(base_url, "")
        self._limits = limits

    @property
    def limits(self) -> BatchLimits:
        return self._limits

    def encode(self, request: Request) -> bytes:
        return wire.encode_row(request)

    def row_ref(self, line: int, custom_id: str) -> str:
        return str(line)

    def _url(self, name: str) -> str:
        return f"{self._root}{VERSION}/{name}"

    async def _each_since(self, since: float) -> AsyncIterator[BatchStatus]:
        """The key's batches created since `since` (the list's order is the provider's)."""
        token: str | None = None
        while True:
            params: dict[str, Any] = {"pageSize": PAGE}
            if token:
                params["pageToken"] = token
            page = await self._get(self._url("batches"), params=params)
            page = page if isinstance(page, dict) else {}
            found = page.get("operations", page.get("batches"))
            for item in found if isinstance(found, list) else []:
                status = wire.batch_status(item)
                if status.id and status.created_at >= since:
                    yield status
            token = page.get("nextPageToken")
            if not token:
                return

    async def find(self, job: str, shard: int, since: float) -> dict[BatchTag, str]:
        found: dict[BatchTag, tuple[float, str]] = {}
        async for status in self._each_since(since):
            tag = status.tag
            if tag is None or tag.job != job or tag.shard != shard:
                continue
            if tag not in found or status.created_at < found[tag][0]:
                found[tag] = (status.created_at, status.id)
        return {tag: batch_id for tag, (_, batch_id) in found.items()}

    async def listed(self, since: float) -> list[BatchStatus]:
        return [status async for status in self._each_since(since)]

    async def _upload(self, upload: BatchUpload, tag: BatchTag) -> str:
        """The part's rows as a JSONL file through the Files API's resumable upload: its name."""
        data = file_of(upload).read()
        start = {
            "X-Goog-Upload-Protocol": "resumable",
            "X-Goog-Upload-Command": "start",
            "X-Goog-Upload-Header-Content-Length": str(len(data)),
            "X-Goog-Upload-Header-Content-Type": JSONL_MIME,
            "Content-Type": "application/json",
        }
        meta = orjson.dumps({"file": {"displayName": wire.display_name(tag), "mimeType": JSONL_MIME}})
        answer = await self._call("POST", f"{self._root}/upload{VERSION}/files", data=meta, headers=start)
        location = next((v for k, v in answer.headers.items() if k.lower() == "x-goog-upload-url"), None)
        if not answer.ok or not location:
            raise ProviderUnavailable(f"starting the input file's upload: {answer.refusal()}")
        finish = {"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "0"}
        timeout = aiohttp.ClientTimeout(total=CREATE_TIMEOUT_S)
        done = await self._call("POST", location, data=data, headers=finish, timeout=timeout)
        file = done.body.get("file") if isinstance(done.body, dict) else None
        name = file.get("name") if isinstance(file, dict) else None
        if not done.ok or not isinstance(name, str):
            raise ProviderUnavailable(f"uploading the input file: {done.refusal()}")
        return name

    async def _created(self, tag: BatchTag, since: float) -> str | None:
        found = [s for s in [s async for s in self._each_since(since)] if s.tag == tag]
        return min(found, key=lambda s: s.created_at).id if found else None

    async def submit(self, upload: BatchUpload, tag: BatchTag) -> str:
        if not upload.model:
            raise ProviderUnavailable("a Gemini batch names its model, and the part names none")
        body = inline_body(upload, tag)
        if body is None:
            config = {"fileName": await self._upload(upload, tag)}
            body = bytearray(orjson.dumps({"batch": {"displayName": wire.display_name(tag), "inputConfig": config}}))
        url = self._url(f"models/{model_path(upload.model)}:batchGenerateContent")
        window = time.time() - CLOCK_SLACK_S
        timeout = aiohttp.ClientTimeout(total=CREATE_TIMEOUT_S)
        tries = 0
        while True:
            tries += 1
            failure: str
            try:
                answer: Answer | None = await self._once(
                    "POST", url, data=bytes(body), headers={"Content-Type": "application/json"}, timeout=timeout
                )
            except (aiohttp.ClientError, TimeoutError) as exc:
                answer, failure = None, repr(exc)
            if answer is not None:
                name = wire.batch_status(answer.body).id if answer.ok else ""
                if name:
                    return name
                failure = answer.refusal()
                if answer.status == QUEUE_FULL_STATUS:
                    # the model's batch queue (enqueued tokens) or the key's rate is full: nothing was created
                    raise QueueFull(failure)
                if answer.status < 500:
                    raise ProviderUnavailable(f"creating a batch: {failure}")
            # no answer, or a 5xx: the batch may exist, under its tag
            found = await self._created(tag, window)
            if found:
                return found
            if tries >= CREATE_POLICY.max_attempts:
                raise ProviderUnavailable(f"creating a batch: {failure}")
            await asyncio.sleep(backoff_s(tries, CREATE_POLICY, random.random, floor=CREATE_JITTER_FLOOR))

    async def status(self, batch_id: str) -> BatchStatus:
        return wire.batch_status(await self._get(self._url(batch_id)))

    async def rows(self, status: BatchStatus) -> AsyncIterator[BatchRow]:
        if not status.output_file:
            return
        created = int(status.ended_at or time.time())
        if status.output_file.startswith("files/"):
            url = f"{self._root}/download{VERSION}/{status.output_file}:download"
            async for record in self._records(url, params={"alt": "media"}):
                row = wire.parse_row(record, created, None)
                if row is not None:
                    yield row
            return
        batch = wire.batch_of(await self._get(self._url(status.output_file)))
        model = batch.get("model")
        for record in wire.inline_responses(batch):
            row = wire.parse_row(record, created, str(model).removeprefix("models/") if model else None)
            if row is not None:
                yield row

    async def cancel(self, batch_id: str) -> BatchStatus:
        try:
            answer = await self._call("POST", self._url(f"{batch_id}:cancel"))
            failure = None if answer.ok else answer.refusal()
        except ProviderUnavailable as exc:
            failure = str(exc)
        try:
            now: BatchStatus | None = await self.status(batch_id)
        except ProviderUnavailable as exc:
            now, failure = None, failure or str(exc)
        if failure is None and now is not None:
            # Gemini has no cancelling state: a batch asked to stop runs until it says cancelled
            return now if now.ended else replace(now, state=BatchState.CANCELLING)
        raise CancelRefused(failure or "the provider gave no batch", now)

    async def staged(self, tag: BatchTag, endpoint: str) -> bool:
        # not kept yet: a file part (over the 20 MB inline limit) that the queue refused is
        # uploaded again with its next attempt, as before Bedrock's parts were kept
        return False

    async def clean_up(self, statuses: Iterable[BatchStatus]) -> None:
        for status in statuses:
            if not status.ended:
                continue
            names = [f for f in (status.input_file, status.output_file) if f and f.startswith("files/")]
            for name in [*names, status.id]:
                with contextlib.suppress(ProviderUnavailable, aiohttp.ClientError, TimeoutError):
                    await self._call("DELETE", self._url(name))


def within_limits(limits: BatchLimits | None = None) -> BatchLimits:
    """`limits` (None: Gemini's) kept within Gemini's own, with its 48-hour window."""
    chosen = limits or BatchLimits(max_records=MAX_REQUESTS, max_bytes=MAX_BYTES)
    return replace(
        chosen,
        max_records=min(chosen.max_records, MAX_REQUESTS),
        max_bytes=min(chosen.max_bytes, MAX_BYTES),
        completion_window_s=COMPLETION_WINDOW_S,
    )


def opener(base_url: str, api_key: str, *, timeout_s: float, limits: BatchLimits | None = None) -> BatchApiOpener:
    """Opens a `GeminiBatchApi` on its own session for each run, closed when the run ends."""
    chosen = within_limits(limits)
    return opener_of(
        lambda session: GeminiBatchApi(session, base_url, chosen), GEMINI.auth_headers(api_key), timeout_s=timeout_s
    )
