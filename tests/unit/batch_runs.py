"""One batch run through a provider family's `BatchApi` against the simulator, as the batch runners
run it: lines as the shard reads them (translated to the family's wire), a part's upload, the batch
submitted, read until it ends and its rows collected. Shared by the families' Batch API tests."""

from __future__ import annotations

import asyncio
import io

import orjson
from sluice.contract.model import Request
from sluice.providers.batch import BatchApi, BatchApiOpener, BatchRow, BatchStatus, BatchTag, BatchUpload
from sluice.providers.format import RequestFormat

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


def chat(family: RequestFormat, model: str, line: int, custom_id: str, text: str = "I loved it") -> Request:
    """A chat line as the shard reads it: its body translated to the family's wire (`lines.parse_line`)."""
    body = {"model": model, "messages": [{"role": "user", "content": f"positive or negative: {text}"}]}
    return Request(line, custom_id, "POST", CHAT, orjson.dumps(family.to_wire(CHAT, body)))


def responses(family: RequestFormat, model: str, line: int, custom_id: str, text: str = "I loved it") -> Request:
    body = {"model": model, "input": f"positive or negative: {text}", "max_output_tokens": 4}
    return Request(line, custom_id, "POST", RESPONSES, orjson.dumps(family.to_wire(RESPONSES, body)))


def upload(model: str, api: BatchApi, requests: list[Request]) -> BatchUpload:
    rows = b"".join(api.encode(r) for r in requests)
    return BatchUpload(io.BytesIO(rows), requests[0].path, model, rows=len(requests), size=len(rows))


async def until_ended(api: BatchApi, batch_id: str) -> BatchStatus:
    status = await api.status(batch_id)
    while not status.ended:
        await asyncio.sleep(0.01)
        status = await api.status(batch_id)
    return status


def run_batch(
    opened: BatchApiOpener, model: str, tag: BatchTag, requests: list[Request]
) -> tuple[BatchStatus, list[BatchRow]]:
    """`requests` as one batch: its status once it ended, and its rows."""

    async def go() -> tuple[BatchStatus, list[BatchRow]]:
        async with opened() as api:
            batch_id = await api.submit(upload(model, api, requests), tag)
            status = await until_ended(api, batch_id)
            return status, [row async for row in api.rows(status)]

    return asyncio.run(go())
