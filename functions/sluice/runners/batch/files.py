"""A batch shard's input files: its rows cut into files, one endpoint and model each, within the
provider's request, byte and queue limits, and the row map that says which line each row is."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, cast

import orjson

from sluice.contract.model import Request
from sluice.limits.batch_queue import estimate_tokens
from sluice.providers.batch import BatchUpload
from sluice.providers.format import Unsupported
from sluice.shard.frame import ShardSpec

# a batch file stays in memory up to this size, then spills to /tmp
SPOOL_BYTES = 8 << 20


@dataclass
class BatchPart:
    """One batch input file: a single endpoint and model, within the provider's limits."""

    index: int
    endpoint: str
    model: str | None
    lines: list[int] = field(default_factory=list)
    custom_ids: list[str] = field(default_factory=list)
    size: int = 0
    # input tokens the provider's queue will count (`batch_queue.estimate_tokens`)
    tokens: int = 0
    file: IO[bytes] | None = None

    def add(self, request: Request, row: bytes) -> None:
        if self.file is None:
            # open across calls and closed by close(): the submit holds every part until it uploads it
            self.file = cast(IO[bytes], tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES))  # noqa: SIM115
        self.file.write(row)
        self.lines.append(request.line)
        self.custom_ids.append(request.custom_id)
        self.size += len(row)
        self.tokens += estimate_tokens(request)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None

    def upload(self) -> BatchUpload:
        """The file as the provider's `submit` takes it; none for a part read from its row map
        alone, whose file the provider holds from an earlier attempt (`BatchApi.staged`)."""
        return BatchUpload(self.file, self.endpoint, self.model, rows=len(self.lines), size=self.size)

    def content(self) -> bytes:
        """The whole file (tests and small parts); uploads stream `file` instead."""
        if self.file is None:
            return b""
        self.file.seek(0)
        return self.file.read()

    def manifest(self) -> bytes:
        return orjson.dumps(
            {
                "index": self.index,
                "endpoint": self.endpoint,
                "model": self.model,
                "lines": self.lines,
                "custom_ids": self.custom_ids,
                "tokens": self.tokens,
            }
        )

    @classmethod
    def from_manifest(cls, raw: bytes) -> BatchPart:
        data = orjson.loads(raw)
        return cls(
            index=data["index"],
            endpoint=data["endpoint"],
            model=data["model"],
            lines=data["lines"],
            custom_ids=data["custom_ids"],
            tokens=int(data.get("tokens", 0)),
        )


def part_key(spec: ShardSpec, index: int) -> str:
    return f"{spec.prefix}batch-{index:05d}.json"


def request_model(request: Request) -> str | None:
    if not request.body:
        return None
    model = orjson.loads(request.body).get("model")
    return model if isinstance(model, str) else None


def split_parts(
    requests: Iterable[Request],
    *,
    max_requests: int,
    max_bytes: int,
    encode: Callable[[Request], bytes],
    max_tokens: Callable[[str | None], int] | None = None,
    unbatchable: list[int] | None = None,
) -> list[BatchPart]:
    """Cut the requests into batch files, each row as the provider's `encode` writes it: one file
    per (endpoint, model), a new one at any limit: requests, bytes, or the model's queue limit in
    tokens (`max_tokens`, 0 = none), since a file over the queue limit could never be enqueued.

    A request the provider's Batch API cannot take (`encode` raises `Unsupported`: Bedrock batch
    inference runs some model families only) is in no file; with `unbatchable`, its line is added
    there, for the shard's direct pass to send, else the error is raised.

    Deterministic for the same requests, so a retried submit numbers its parts the same way
    and recognises the batches it created before.
    """
    parts: list[BatchPart] = []
    current: dict[tuple[str, str | None], BatchPart] = {}
    limits: dict[str | None, int] = {}
    for request in requests:
        try:
            row = encode(request)
        except Unsupported:
            if unbatchable is None:
                raise
            unbatchable.append(request.line)
            continue
        group = (request.path, request_model(request))
        if group[1] not in limits:
            limits[group[1]] = max_tokens(group[1]) if max_tokens is not None else 0
        limit = limits[group[1]]
        part = current.get(group)
        full = part is not None and (
            len(part.lines) >= max_requests
            or (
                part.lines
                and (part.size + len(row) > max_bytes or (limit > 0 and part.tokens + estimate_tokens(request) > limit))
            )
        )
        if part is None or full:
            part = BatchPart(index=len(parts), endpoint=group[0], model=group[1])
            parts.append(part)
            current[group] = part
        part.add(request, row)
    return parts
