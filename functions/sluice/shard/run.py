"""A run of a shard as its runner starts it, read from the frame once: what earlier runs left, this
run's number, the writer that checkpoints its outcomes and the cache that writer fills.

Every mode's run begins the same way; the runner then works from `ShardRun` and does not go back to
the frame's readers for these.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sluice.cache.blobs import cache_store
from sluice.cache.entries import CacheFill, segment_name
from sluice.contract.model import Request
from sluice.providers import family
from sluice.shard.frame import ShardContext, ShardSpec, read_shard_lines
from sluice.shard.parts import Checkpoint, PartWriter, load_checkpoint


@dataclass(frozen=True)
class ShardRun:
    checkpoint: Checkpoint
    # this run's number: its parts are `part-<number>-<seq>`
    number: int
    writer: PartWriter
    fill: CacheFill | None

    @property
    def first(self) -> bool:
        """No earlier run of the shard wrote a part (Plan's cached part is run 0)."""
        return self.checkpoint.runs == 0


def open_run(
    ctx: ShardContext,
    spec: ShardSpec,
    *,
    path: str,
    item_rows_for_results: bool = True,
    fills_cache: bool = True,
) -> ShardRun:
    """Load the shard's checkpoint and open this run's writer, on `path` (the mode its outcomes are
    sent by), filling the cache when the job writes to it and `fills_cache`."""
    checkpoint = load_checkpoint(ctx.s3, spec)
    number = checkpoint.runs + 1
    fill = _fill(ctx, spec, run=number, path=path) if fills_cache else None
    writer = PartWriter(
        s3=ctx.s3,
        store=ctx.store,
        spec=spec,
        run=number,
        item_rows_for_results=item_rows_for_results,
        path=path,
        progress=ctx.progress,
        cache=fill,
    )
    return ShardRun(checkpoint=checkpoint, number=number, writer=writer, fill=fill)


def _fill(ctx: ShardContext, spec: ShardSpec, *, run: int, path: str) -> CacheFill | None:
    """The cache a shard's writer fills, when its job writes to the cache."""
    if not spec.fills_cache:
        return None

    def keys_for() -> Iterator[Request]:
        return (item for item in read_shard_lines(ctx.s3, spec) if isinstance(item, Request))

    return CacheFill(
        cache_store(ctx.s3, ctx.settings),
        base_url=ctx.settings.cache_provider_name,
        name=segment_name(spec.job_id, spec.shard, run, path),
        request_format=family(spec.provider),
        keep_incomplete=spec.cache_incomplete,
        keys_for=keys_for,
        # `read_shard_lines` sorted the bodies' keys, as it does for every job that fills the cache
        canonical=True,
    )
