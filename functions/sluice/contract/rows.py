"""The store's rows as the core, the CLI and the local cloud read them, parsed strictly.

A shard row is written by the store alone (`sluice.store`, `sluice.batch_rows`,
`sluice.webhook_rows`): Plan writes its figures, the shard's runs, a webhook and a stop the rest.
An attribute those writes never make is an error here, never a silent default; one a shard's
path has not written yet (a direct shard has no batches) is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .layout import PARTITION_KEY, SORT_KEY
from .state import strict


@dataclass(frozen=True)
class ShardRow:
    """One shard's row: Plan's figures, its runs' counts, and what a batch shard recorded."""

    shard: int
    lines: int
    requests: int
    mode: str
    status: str
    done: int
    failed: int
    runs: int
    expires_at: int
    # items still out at the provider (background): a webhook counts them off
    waiting: int = 0
    # the job's status when it told the shard to stop (`JobStore.stop_shards`)
    stop: str | None = None
    # the task token a webhook completes the shard's wait with
    token: str | None = None
    # the batch (or QUEUED# marker) a webhook looks the shard up by
    provider_id: str | None = None
    batch_submit_at: float | None = None
    batch_parts: tuple[Mapping[str, Any], ...] | None = None
    batch_ids: tuple[str, ...] | None = None
    batch_states: Mapping[str, Mapping[str, Any]] | None = None
    batch_tries: Mapping[str, int] | None = None
    batch_retry_at: float | None = None
    batch_requeued: int | None = None
    batch_settled: str | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> ShardRow:
        """The row from its item (numbers already plain), keys aside; an unknown attribute is an error."""
        data = {k: v for k, v in item.items() if k not in (PARTITION_KEY, SORT_KEY)}
        for name in ("batch_parts", "batch_ids"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        return strict(cls, data, "shard row")

    def as_dict(self) -> dict[str, Any]:
        """The attributes the row holds, as JSON would show them (`sluice status --json`)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if v is not None}
