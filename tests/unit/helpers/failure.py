"""What test_failure.py and the tests beside it share."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from sluice.contract import Planned
from sluice.contract.model import Outcome
from sluice.shard.assembly import assemble
from sluice.shard.frame import ShardSpec
from sluice.shard.parts import PartWriter
from sluice.store.jobs import ItemState, JobStore

from tests.conftest import request_line

BUCKET = "failure-test"
JOB = "job-failed"
LINES = 12


class NoProgress:
    """A PartWriter's store: the tests read the parts, not the rows."""

    def record_progress(self, job_id: str, shard: int, items: list[ItemState], **counts: Any) -> None:
        pass

    def settle_early(self, job_id: str, shard: int, items: list[ItemState]) -> int:
        return 0


def answer(line: int) -> Outcome:
    body = {"model": "gpt-4o-mini", "usage": {"prompt_tokens": 10, "completion_tokens": 2}}
    return Outcome(line, f"c-{line}", 200, body, f"req-{line}")


def failed_job(s3: Any, store: JobStore, *, shards: int, done: dict[int, int], part_rows: int) -> Planned:
    """A job of `shards` shards of LINES lines whose shards in `done` wrote that many lines in
    parts of `part_rows` rows; the ones that wrote every line finished (their outputs assembled)."""
    data = b"".join(request_line(f"c-{n}") for n in range(1, shards * LINES + 1))
    key = "inbox/failed.jsonl"
    etag = s3.put_object(Bucket=BUCKET, Key=key, Body=data)["ETag"]
    offsets = [0]
    for row in data.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(row))
    specs = [
        ShardSpec(
            job_id=JOB,
            shard=n,
            bucket=BUCKET,
            key=key,
            etag=etag,
            start=offsets[n * LINES],
            end=offsets[(n + 1) * LINES],
            first_line=n * LINES + 1,
            lines=LINES,
            mode="direct",
            concurrency=4,
            max_attempts=2,
        )
        for n in range(shards)
    ]
    for spec in specs:
        writer = PartWriter(s3=s3, store=NoProgress(), spec=spec, run=1, every=part_rows)  # type: ignore[arg-type]
        for line in range(spec.first_line, spec.first_line + done.get(spec.shard, 0)):
            writer.add_outcome(answer(line))
        writer.flush(finished=False)
        if done.get(spec.shard) == LINES:
            assemble(s3, spec)
    manifest = f"jobs/{JOB}/manifest.json"
    s3.put_object(Bucket=BUCKET, Key=manifest, Body=orjson.dumps([dataclasses.asdict(s) for s in specs]))
    store.claim_job(JOB, execution="x", bucket=BUCKET, key=key, etag=etag, started_at=0.0)
    return Planned(
        job_id=JOB,
        bucket=BUCKET,
        key=key,
        etag=etag,
        manifest_key=manifest,
        output_prefix="outbox/failed",
        map_concurrency=shards,
        duplicate=False,
        shards=shards,
        lines=shards * LINES,
    )
