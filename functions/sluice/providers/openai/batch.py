"""OpenAI's Files and Batch APIs (and the providers that copy them) as a `BatchApi`, through the
official SDK: a JSONL file uploaded with `purpose=batch`, a batch per file with the shard's tag in
its metadata, output and error files streamed back, and `token_limit_exceeded` for a full queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any, Literal, cast

import openai
import orjson

from sluice.contract.model import ErrorCode, Request
from sluice.core.retry import RetryPolicy, backoff_s

from ..batch import (
    CLOCK_SLACK_S,
    CREATE_JITTER_FLOOR,
    ENDED,
    BatchApiOpener,
    BatchCounts,
    BatchLimits,
    BatchProblem,
    BatchRow,
    BatchState,
    BatchStatus,
    BatchTag,
    BatchUpload,
    CancelRefused,
    QueueFull,
    file_of,
    json_record,
)

# OpenAI's limits for one batch (platform.openai.com/docs/guides/batch)
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024 * 1024
COMPLETION_WINDOW: Literal["24h"] = "24h"
TOKEN_LIMIT_EXCEEDED = "token_limit_exceeded"
# the SDK retries 408/409/429/5xx and lost connections itself, with backoff and Retry-After
SDK_MAX_RETRIES = 5
# ...except for creating a batch, which has no idempotency key: a lost answer may hide a batch
# that exists, so each attempt looks for it before trying again
CREATE_POLICY = RetryPolicy(max_attempts=5, base_delay_s=1.0)
_AMBIGUOUS = (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError)
# a 200 MB upload needs far longer than one inference call
UPLOAD_TIMEOUT_S = 600.0
# the row codes OpenAI gives rows it never ran, as Sluice's codes
_UNFINISHED = {"batch_expired": ErrorCode.BATCH_EXPIRED, "batch_cancelled": ErrorCode.BATCH_CANCELLED}
# when a batch ended, by the first of these it has; the last two only for one that names no end
_ENDED_AT = ("completed_at", "failed_at", "expired_at", "cancelled_at", "finalizing_at", "in_progress_at")
_EXCERPT = 300


def batch_row(request: Request) -> bytes:
    """The request as a Batch API input line; the body bytes pass through untouched."""
    return b'{"custom_id":%s,"method":"POST","url":%s,"body":%s}\n' % (
        orjson.dumps(request.custom_id),
        orjson.dumps(request.path),
        request.body or b"{}",
    )


def _metadata(tag: BatchTag) -> dict[str, str]:
    metadata = {"job": tag.job, "shard": str(tag.shard), "part": str(tag.part)}
    if tag.attempt > 1:
        # a file created again after `token_limit_exceeded`: the failed batch stays listed
        metadata["try"] = str(tag.attempt)
    return metadata


def _tag(metadata: dict[str, Any] | None) -> BatchTag | None:
    metadata = metadata or {}
    numbers = [str(metadata.get(name, "")) for name in ("shard", "part")] + [str(metadata.get("try", "1"))]
    if "job" not in metadata or not all(n.isdigit() for n in numbers):
        return None
    shard, part, attempt = map(int, numbers)
    return BatchTag(str(metadata["job"]), shard, part, attempt)


def batch_status(batch: Any) -> BatchStatus:
    """An SDK `Batch` (or anything shaped like one) as a `BatchStatus`."""
    problems = tuple(
        BatchProblem(
            code=str(problem.code or ""),
            message=str(problem.message or ""),
            param=problem.param,
            row=problem.line,
        )
        for problem in ((batch.errors.data if getattr(batch, "errors", None) else None) or [])
    )
    ended = None
    if batch.status in ENDED:
        ended = next((float(v) for v in (getattr(batch, name, None) for name in _ENDED_AT) if v), None)
    completed = getattr(batch, "completed_at", None) if batch.status == BatchState.COMPLETED else None
    counts = getattr(batch, "request_counts", None)
    return BatchStatus(
        id=str(getattr(batch, "id", "")),
        state=str(batch.status),
        created_at=float(batch.created_at),
        ended_at=ended,
        completed_at=float(completed) if completed else None,
        tag=_tag(getattr(batch, "metadata", None)),
        counts=BatchCounts(counts.total, counts.completed, counts.failed) if counts else BatchCounts(),
        input_file=getattr(batch, "input_file_id", None),
        output_file=getattr(batch, "output_file_id", None),
        error_file=getattr(batch, "error_file_id", None),
        problems=problems,
        queue_full=batch.status == BatchState.FAILED and any(p.code == TOKEN_LIMIT_EXCEEDED for p in problems),
    )


def _provider_message(status: int, body: Any) -> str:
    message = code = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message, code = error.get("message"), error.get("code") or error.get("type")
    text = f"HTTP {status}"
    if message:
        text += f": {str(message)[:_EXCERPT]}"
    if code:
        text += f" ({code})"
    return text


def parse_row(record: dict[str, Any]) -> BatchRow | None:
    """One output or error file line as a `BatchRow`; None when it says nothing usable."""
    ref = str(record.get("custom_id"))
    response = record.get("response")
    error = record.get("error")
    if isinstance(response, dict) and isinstance(response.get("status_code"), int):
        status = int(response["status_code"])
        body = response.get("body")
        request_id = response.get("request_id")
        request_id = request_id if isinstance(request_id, str) else None
        if 200 <= status < 300:
            return BatchRow(ref, status, body, request_id)
        return BatchRow(
            ref,
            status,
            body,
            request_id,
            error_code=ErrorCode.PROVIDER_ERROR,
            error_message=_provider_message(status, body),
        )
    if isinstance(error, dict):
        code = str(error.get("code") or "")
        if code in _UNFINISHED:
            return BatchRow(ref, error_code=_UNFINISHED[code], unfinished=True)
        message = str(error.get("message") or "the provider reported an error without a message")
        return BatchRow(ref, error_code=code or ErrorCode.PROVIDER_ERROR, error_message=message)
    return None


def _refusal(exc: openai.APIError) -> str:
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {exc.message}"
    return str(exc)


class OpenAIBatchApi:
    """`BatchApi` over an open `openai.AsyncOpenAI` client."""

    def __init__(self, client: openai.AsyncOpenAI, limits: BatchLimits) -> None:
        self._client = client
        self._limits = limits

    @property
    def limits(self) -> BatchLimits:
        return self._limits

    def encode(self, request: Request) -> bytes:
        return batch_row(request)

    def row_ref(self, line: int, custom_id: str) -> str:
        # OpenAI takes any custom_id, unique within the file: the user's is the row's
        return custom_id

    async def _each_since(self, since: float) -> AsyncIterator[Any]:
        """The key's batches, newest first, down to the first created before `since`."""
        async for batch in self._client.batches.list(limit=100):
            if batch.created_at < since:
                break
            yield batch

    async def find(self, job: str, shard: int, since: float) -> dict[BatchTag, str]:
        found: dict[BatchTag, str] = {}
        async for batch in self._each_since(since):
            tag = _tag(batch.metadata)
            if tag is not None and tag.job == job and tag.shard == shard:
                # a second copy should not exist; if one does, the older one is the one recorded
                found[tag] = batch.id
        return found

    async def listed(self, since: float) -> list[BatchStatus]:
        return [batch_status(batch) async for batch in self._each_since(since)]

    async def submit(self, upload: BatchUpload, tag: BatchTag) -> str:
        file = file_of(upload)
        name = f"sluice-{tag.job}-{tag.shard:05d}-{tag.part:03d}.jsonl"
        uploaded = await self._client.files.create(
            file=(name, file, "application/jsonl"), purpose="batch", timeout=UPLOAD_TIMEOUT_S
        )
        started = time.time()
        once = self._client.with_options(max_retries=0)
        tries = 0
        while True:
            tries += 1
            try:
                batch = await once.batches.create(
                    input_file_id=uploaded.id,
                    endpoint=cast(Any, upload.endpoint),
                    completion_window=COMPLETION_WINDOW,
                    metadata=_metadata(tag),
                )
                return batch.id
            except openai.APIError as exc:
                if getattr(exc, "code", None) == TOKEN_LIMIT_EXCEEDED:
                    # refused outright rather than failed at validation: the same "wait and resubmit"
                    with contextlib.suppress(openai.APIError):
                        await self._client.files.delete(uploaded.id)
                    raise QueueFull(str(exc)) from exc
                if not isinstance(exc, _AMBIGUOUS):
                    raise
                failure = exc
            found = await self.find(tag.job, tag.shard, since=started - CLOCK_SLACK_S)
            if tag in found:
                return found[tag]
            if tries >= CREATE_POLICY.max_attempts:
                raise failure
            await asyncio.sleep(backoff_s(tries, CREATE_POLICY, random.random, floor=CREATE_JITTER_FLOOR))

    async def status(self, batch_id: str) -> BatchStatus:
        return batch_status(await self._client.batches.retrieve(batch_id))

    async def _records(self, file_id: str) -> AsyncIterator[dict[str, Any]]:
        async with self._client.files.with_streaming_response.content(file_id) as response:
            async for text in response.iter_lines():
                if (record := json_record(text)) is not None:
                    yield record

    async def rows(self, status: BatchStatus) -> AsyncIterator[BatchRow]:
        for file_id in (status.output_file, status.error_file):
            if not file_id:
                continue
            async for record in self._records(file_id):
                row = parse_row(record)
                if row is not None:
                    yield row

    async def cancel(self, batch_id: str) -> BatchStatus:
        try:
            return batch_status(await self._client.batches.cancel(batch_id))
        except openai.APIError as exc:
            try:
                now = await self.status(batch_id)
            except openai.APIError:
                now = None
            raise CancelRefused(_refusal(exc), now) from exc

    async def staged(self, tag: BatchTag, endpoint: str) -> bool:
        # a refused batch's file is deleted with it: each attempt uploads its own
        return False

    async def clean_up(self, statuses: Iterable[BatchStatus]) -> None:
        for status in statuses:
            for file_id in status.files:
                with contextlib.suppress(openai.APIError):
                    await self._client.files.delete(file_id)


def opener(
    base_url: str,
    api_key: str,
    *,
    timeout_s: float,
    limits: BatchLimits | None = None,
    max_retries: int = SDK_MAX_RETRIES,
) -> BatchApiOpener:
    """Opens an `OpenAIBatchApi` on its own client for each run, closed when the run ends."""
    chosen = limits or BatchLimits(max_records=MAX_REQUESTS, max_bytes=MAX_BYTES)

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[OpenAIBatchApi]:
        async with openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=max_retries, timeout=timeout_s
        ) as client:
            yield OpenAIBatchApi(client, chosen)

    return opened
