"""What each shard of a job left: its figures and batch report, read a few shards at a time.

For a job that failed or was cancelled, a shard that never finished is assembled from its parts
first (`sluice.shard.assembly.assemble_outputs`), every line it did not finish an error.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from itertools import islice
from typing import Any

from sluice.contract import Mode, ShardStats, causes
from sluice.core.aws_errors import read_json_if_any
from sluice.shard.assembly import assemble_outputs
from sluice.shard.frame import ShardSpec
from sluice.shard.parts import S3_IN_FLIGHT, s3_pool


class ShardIncomplete(RuntimeError):
    """Merge reached a shard that never finished (its child execution failed)."""


class OutOfTime(Exception):
    """MarkFailed's time ran out: the `left` shards still to assemble, or (0) the merge itself,
    wait for its next call."""

    def __init__(self, left: int) -> None:
        super().__init__(f"{left} shard(s) left to assemble" if left else "the merge waits for a call of its own")
        self.left = left


# shards read (or assembled) at once: an assembly holds its shard's outputs (~5 MB at 5,000 lines
# of 1 kB) a few times over while it sorts them
SHARD_WORKERS = 4
# shards read ahead of the one being summed: their figures are held until then
READ_AHEAD = 4 * SHARD_WORKERS


def _read_json(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The object as JSON; None if it does not exist."""
    found: dict[str, Any] | None = read_json_if_any(s3, bucket, key)
    return found


def batch_report(s3: Any, spec: ShardSpec) -> dict[str, Any] | None:
    """What a batch shard's batches did (CollectBatch writes it once they have all ended)."""
    return _read_json(s3, spec.bucket, spec.batch_report_key) if spec.mode == Mode.BATCH else None


@dataclass(frozen=True)
class ShardOutput:
    spec: ShardSpec
    figures: ShardStats
    report: dict[str, Any] | None
    # assembled by this call
    assembled: bool = False


def shard_outputs(
    s3: Any,
    specs: list[ShardSpec],
    *,
    missing_code: str | None = None,
    missing_message: str = "",
    deadline: float | None = None,
) -> Iterator[ShardOutput]:
    """Each shard's figures and batch report in the manifest's order, SHARD_WORKERS shards at a time.

    A shard without figures never finished. With `missing_code` it is assembled now from the
    parts it left, every line it did not finish an error with that code; a shard whose turn
    comes after `deadline` (`time.monotonic()`) is left for another call, and OutOfTime says how
    many were once the rest are read. Without `missing_code` it is ShardIncomplete.
    """

    @causes.caused(causes.SHARD_OUTPUTS)
    def read(spec: ShardSpec, fetch: Executor) -> ShardOutput | None:
        found = _read_json(s3, spec.bucket, spec.stats_key)
        if found is not None:
            return ShardOutput(spec, ShardStats.from_dict(found), batch_report(s3, spec))
        if missing_code is None:
            raise ShardIncomplete(f"shard {spec.shard} (lines {spec.first_line}-{spec.last_line}) did not finish")
        if deadline is not None and time.monotonic() > deadline:
            return None
        figures = assemble_outputs(s3, spec, missing_code=missing_code, missing_message=missing_message, pool=fetch)
        return ShardOutput(spec, figures, batch_report(s3, spec), assembled=True)

    left = 0
    # the shards' own requests and their assemblies' together keep S3_IN_FLIGHT in flight
    with s3_pool(workers=S3_IN_FLIGHT - SHARD_WORKERS) as fetch, s3_pool(workers=SHARD_WORKERS) as shards:
        todo = iter(specs)
        pending = deque(shards.submit(read, spec, fetch) for spec in islice(todo, READ_AHEAD))
        while pending:
            output = pending.popleft().result()
            following = next(todo, None)
            if following is not None:
                pending.append(shards.submit(read, following, fetch))
            if output is None:
                left += 1
            else:
                yield output
    if left:
        raise OutOfTime(left)
