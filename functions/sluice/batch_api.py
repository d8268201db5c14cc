"""The provider's Files and Batch APIs as a batch shard uses them: a client, creating a batch (and
finding one a lost answer hid), listing the shard's or the key's batches, deleting the files."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any, Literal, cast

import openai

from . import batch_queue
from .batch_files import BatchPart
from .retry import RetryPolicy, backoff_s
from .shard import ShardContext, ShardSpec

COMPLETION_WINDOW: Literal["24h"] = "24h"
# the SDK retries 408/409/429/5xx and lost connections itself, with backoff and Retry-After
SDK_MAX_RETRIES = 5
# ...except for creating a batch, which has no idempotency key: a lost answer may hide a batch
# that exists, so each attempt looks for it before trying again
CREATE_POLICY = RetryPolicy(max_attempts=5, base_delay_s=1.0)
# equal jitter (at least half of each step): a shard creates its batches alone, so there is
# no crowd to spread out, and every attempt lists the provider's batches first
CREATE_JITTER_FLOOR = 0.5
_AMBIGUOUS = (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError)
# a 200 MB upload needs far longer than one inference call
UPLOAD_TIMEOUT_S = 600.0
# provider and Lambda clocks differ; a retried submit looks this far before its first attempt
CLOCK_SLACK_S = 600


@contextlib.asynccontextmanager
async def provider_api(ctx: ShardContext, client: openai.AsyncOpenAI | None) -> AsyncIterator[openai.AsyncOpenAI]:
    if client is not None:
        yield client
        return
    async with openai.AsyncOpenAI(
        base_url=ctx.settings.provider_base_url,
        api_key=ctx.api_key,
        max_retries=SDK_MAX_RETRIES,
        timeout=ctx.settings.request_timeout_s,
    ) as api:
        yield api


def _attempt(metadata: dict[str, Any]) -> int:
    raw = str(metadata.get("try", "1"))
    return int(raw) if raw.isdigit() else 0


async def created_batches(api: openai.AsyncOpenAI, spec: ShardSpec, since: float) -> dict[tuple[int, int], str]:
    """Batches an earlier attempt of this shard created, by (part, attempt), from their metadata.

    Listed newest first, so the scan stops at the first batch older than that attempt.
    """
    found: dict[tuple[int, int], str] = {}
    async for batch in api.batches.list(limit=100):
        if batch.created_at < since:
            break
        metadata = batch.metadata or {}
        part = metadata.get("part", "")
        if metadata.get("job") == spec.job_id and metadata.get("shard") == str(spec.shard) and part.isdigit():
            # a second copy should not exist; if one does, the older one is the one recorded
            found[(int(part), _attempt(metadata))] = batch.id
    return found


async def listed_batches(
    api: openai.AsyncOpenAI, since: float
) -> dict[tuple[str, int], dict[tuple[int, int], batch_queue.Listed]]:
    """The key's Sluice batches created since `since`, as the queue's reconciling reads them."""
    listed = []
    async for batch in api.batches.list(limit=100):
        if batch.created_at < since:
            break
        listed.append(batch)
    return batch_queue.listed_batches(listed)


def _metadata(spec: ShardSpec, index: int, attempt: int) -> dict[str, str]:
    metadata = {"job": spec.job_id, "shard": str(spec.shard), "part": str(index)}
    if attempt > 1:
        # a file created again after `token_limit_exceeded`: the failed batch stays listed
        metadata["try"] = str(attempt)
    return metadata


class QueueFull(Exception):
    """The provider refused to create a batch because its queue is full: try again later."""


async def create_batch(
    api: openai.AsyncOpenAI, ctx: ShardContext, spec: ShardSpec, part: BatchPart, attempt: int
) -> str:
    assert part.file is not None
    part.file.seek(0)
    name = f"sluice-{spec.job_id}-{spec.shard:05d}-{part.index:03d}.jsonl"
    uploaded = await api.files.create(
        file=(name, part.file, "application/jsonl"), purpose="batch", timeout=UPLOAD_TIMEOUT_S
    )
    started = time.time()
    once = api.with_options(max_retries=0)
    tries = 0
    while True:
        tries += 1
        try:
            batch = await once.batches.create(
                input_file_id=uploaded.id,
                endpoint=cast(Any, part.endpoint),
                completion_window=COMPLETION_WINDOW,
                metadata=_metadata(spec, part.index, attempt),
            )
            return batch.id
        except openai.APIError as exc:
            if getattr(exc, "code", None) == batch_queue.TOKEN_LIMIT_EXCEEDED:
                # refused outright rather than failed at validation: the same "wait and resubmit"
                with contextlib.suppress(openai.APIError):
                    await api.files.delete(uploaded.id)
                raise QueueFull(str(exc)) from exc
            if not isinstance(exc, _AMBIGUOUS):
                raise
            failure = exc
        found = await created_batches(api, spec, since=started - CLOCK_SLACK_S)
        if (part.index, attempt) in found:
            return found[(part.index, attempt)]
        if tries >= CREATE_POLICY.max_attempts:
            raise failure
        await asyncio.sleep(backoff_s(tries, CREATE_POLICY, random.random, floor=CREATE_JITTER_FLOOR))


async def delete_files(api: openai.AsyncOpenAI, batches: Iterable[Any]) -> None:
    """The prompts and answers are ours, in S3 now: don't leave copies at the provider.

    Best effort: a file that is already gone, or a refusal, costs nothing but storage there.
    """
    for batch in batches:
        for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
            if file_id:
                with contextlib.suppress(openai.APIError):
                    await api.files.delete(file_id)
