"""An in-memory `BatchApi`: the provider a batch runner test drives by hand.

It names rows by their input line (`r<line>`), not by the user's custom_id, as a provider with
restricted ids (Anthropic's) would: a runner that matched answers by custom_id would find none.
A test ends a batch with `complete`, `expire` or `cancel`, in whatever row order it likes.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from sluice.contract.model import ErrorCode, Request
from sluice.providers.batch import (
    BatchApiOpener,
    BatchLimits,
    BatchProblem,
    BatchRow,
    BatchState,
    BatchStatus,
    BatchTag,
    BatchUpload,
    CancelRefused,
    QueueFull,
)


@dataclass
class FakeBatch:
    status: BatchStatus
    endpoint: str
    # the refs of the uploaded rows, in file order, and each row's request body
    refs: list[str]
    bodies: dict[str, Any]
    answers: list[BatchRow] = field(default_factory=list)


class FakeBatchApi:
    def __init__(self, limits: BatchLimits | None = None) -> None:
        self._limits = limits or BatchLimits(max_records=50_000, max_bytes=200 << 20)
        # the provider's clock: a minute passes for each batch that ends
        self.clock = time.time()
        self.batches: dict[str, FakeBatch] = {}
        # every call that created a batch, and every refusal, in order
        self.submitted: list[BatchTag] = []
        self.refuse_next: int = 0
        self.cancelled: list[str] = []
        self.deleted: list[str] = []
        self._ids = itertools.count(1)

    def opener(self) -> BatchApiOpener:
        return lambda: contextlib.nullcontext(self)

    @property
    def limits(self) -> BatchLimits:
        return self._limits

    def encode(self, request: Request) -> bytes:
        row = {"ref": self.row_ref(request.line, request.custom_id), "url": request.path}
        return orjson.dumps({**row, "body": orjson.loads(request.body or b"{}")}) + b"\n"

    def row_ref(self, line: int, custom_id: str) -> str:
        return f"r{line}"

    async def submit(self, upload: BatchUpload, tag: BatchTag) -> str:
        if self.refuse_next:
            self.refuse_next -= 1
            raise QueueFull("the fake's queue is full")
        assert upload.file is not None, "the fake stages no file: every attempt uploads"
        upload.file.seek(0)
        rows = [orjson.loads(line) for line in upload.file.read().splitlines()]
        assert len(rows) == upload.rows
        n = next(self._ids)
        batch_id = f"fb_{n}"
        self.submitted.append(tag)
        self.clock += 1
        status = BatchStatus(
            id=batch_id,
            state=BatchState.IN_PROGRESS,
            created_at=self.clock,
            tag=tag,
            input_file=f"in_{n}",
        )
        refs = [row["ref"] for row in rows]
        self.batches[batch_id] = FakeBatch(status, upload.endpoint, refs, {row["ref"]: row["body"] for row in rows})
        return batch_id

    async def find(self, job: str, shard: int, since: float) -> dict[BatchTag, str]:
        return {
            b.status.tag: b.status.id
            for b in self.batches.values()
            if b.status.tag and (b.status.tag.job, b.status.tag.shard) == (job, shard) and b.status.created_at >= since
        }

    async def listed(self, since: float) -> list[BatchStatus]:
        return [b.status for b in self.batches.values() if b.status.created_at >= since]

    async def status(self, batch_id: str) -> BatchStatus:
        return self.batches[batch_id].status

    async def rows(self, status: BatchStatus) -> AsyncIterator[BatchRow]:
        for row in self.batches[status.id].answers:
            yield row

    async def cancel(self, batch_id: str) -> BatchStatus:
        batch = self.batches.get(batch_id)
        if batch is None:
            raise CancelRefused("HTTP 404: no such batch", None)
        if batch.status.ended:
            raise CancelRefused(f"HTTP 400: the batch has {batch.status.state}", batch.status)
        self.cancelled.append(batch_id)
        batch.status = replace(batch.status, state=BatchState.CANCELLING)
        return batch.status

    async def staged(self, tag: BatchTag, endpoint: str) -> bool:
        return False

    async def clean_up(self, statuses: Iterable[BatchStatus]) -> None:
        for status in statuses:
            self.deleted.extend(self.batches[status.id].status.files)

    # what the test does as the provider

    def _end(self, batch_id: str, state: str, answers: list[BatchRow], **changes: Any) -> None:
        batch = self.batches[batch_id]
        self.clock += 60
        output = f"out_{batch_id}" if answers else None
        # as the providers say it: only a batch that completed has a completion time
        completed = self.clock if state == BatchState.COMPLETED else None
        batch.status = replace(
            batch.status, state=state, ended_at=self.clock, completed_at=completed, output_file=output, **changes
        )
        batch.answers = answers

    def answer(self, ref: str, batch_id: str, *, status_code: int = 200) -> BatchRow:
        body = {"echo": self.batches[batch_id].bodies[ref]}
        if status_code == 200:
            return BatchRow(ref, 200, body, f"req_{ref}")
        return BatchRow(ref, status_code, body, None, ErrorCode.PROVIDER_ERROR, f"HTTP {status_code}")

    def complete(self, batch_id: str, *, order: list[str] | None = None, failing: Iterable[str] = ()) -> None:
        """Answer every row, in `order` (the file's by default), `failing` ones with a 500."""
        bad = set(failing)
        refs = order or self.batches[batch_id].refs
        rows = [self.answer(ref, batch_id, status_code=500 if ref in bad else 200) for ref in refs]
        self._end(batch_id, BatchState.COMPLETED, rows)

    def expire(self, batch_id: str, *, answered: int, marked: int = 0) -> None:
        """End the batch expired with its first `answered` rows answered, the next `marked` rows
        named as expired, and the rest not named at all."""
        refs = self.batches[batch_id].refs
        rows = [self.answer(ref, batch_id) for ref in refs[:answered]]
        rows += [BatchRow(ref, error_code=ErrorCode.BATCH_EXPIRED, unfinished=True) for ref in refs[answered:][:marked]]
        self._end(batch_id, BatchState.EXPIRED, rows)

    def finish_cancel(self, batch_id: str, *, answered: int) -> None:
        refs = self.batches[batch_id].refs
        self._end(batch_id, BatchState.CANCELLED, [self.answer(ref, batch_id) for ref in refs[:answered]])

    def refuse_for_full_queue(self, batch_id: str) -> None:
        """Fail the batch as a provider does when its queue was full: nothing ran."""
        problem = BatchProblem("queue_full", "the fake's queue is full")
        self._end(batch_id, BatchState.FAILED, [], problems=(problem,), queue_full=True)
