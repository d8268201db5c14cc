"""The store's rows as the core, the CLI and the local cloud read them, parsed strictly.

Every row is written by the store alone (`sluice.store.jobs`, `sluice.store.batch_rows`,
`sluice.store.webhook_rows`). The job row: Plan's claim, then its plan, the shards' budget figures, and
how the job ended. A shard row: Plan's figures, the shard's runs, a webhook and a stop the rest.
An item row: a line a shard checkpointed (failed, or out at the provider), settled by a webhook.
An attribute those writes never make is an error here, never a silent default; one a path has
not written yet (a job still planning has no plan, a direct shard no batches) is None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from .layout import ITEM_RESPONSE_ATTRIBUTE, PARTITION_KEY, SORT_KEY
from .state import strict
from .summary import JsonRecord, SummaryRow


def _attributes(item: Mapping[str, Any]) -> dict[str, Any]:
    """A row's attributes, its keys aside (numbers already plain)."""
    return {k: v for k, v in item.items() if k not in (PARTITION_KEY, SORT_KEY)}


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
    # the hour the shard took its slot among the shards in flight in, while it holds one
    # (`sluice.limits.shard_slots`)
    slot_window: int | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> ShardRow:
        """The row from its item (numbers already plain), keys aside; an unknown attribute is an error."""
        data = _attributes(item)
        for name in ("batch_parts", "batch_ids"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        return strict(cls, data, "shard row")

    def as_dict(self) -> dict[str, Any]:
        """The attributes the row holds, as JSON would show them (`sluice status --json`)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class CollectedBatch:
    """What CollectBatch did with one batch that ended: the shard row keeps it under the batch's
    id (`ShardRow.batch_states`), and the shard's batch report lists it. `unfinished`: rows the
    provider never ran; `left`: those of them RunShard sends directly (the job's policy);
    `turnaround_s`: created to ended in the provider's whole seconds, what a batch row waits
    instead of a latency (None when the provider gave no end: the row then holds none);
    `measured_s`: created to completed, for a batch that completed, which Merge keeps for the
    deadline plans of later jobs of its `model` (None for any other end); `censored_s`: created to
    ended for a batch cancelled or expired first, kept as "at least this long" (None otherwise)."""

    status: str
    requests: int
    results: int
    errors: int
    unfinished: int
    left: int
    turnaround_s: float | None = None
    model: str | None = None
    measured_s: float | None = None
    censored_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CollectedBatch:
        return strict(cls, data, "a collected batch")


@dataclass(frozen=True)
class PlanCache(JsonRecord):
    """The response cache as Plan used it: the job's cache mode and the lines it answered."""

    mode: str
    hits: int


@dataclass(frozen=True)
class PlanFigures(JsonRecord):
    """What Plan found in the input and how it runs the job: the job row's `plan`. `lines`
    counts every input line, `requests` the ones not blank, `invalid` the lines Plan refused by
    error code (errors from the start), `bytes` the object's size; `mode`, `concurrency` and
    `max_error_rate` are the job's options as Plan resolved them."""

    lines: int
    requests: int
    invalid: dict[str, int]
    blank: int
    bytes: int
    shards: int
    mode: str
    concurrency: int
    max_error_rate: float
    cache: PlanCache
    plan_seconds: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanFigures:
        parsed = dict(data)
        if parsed.get("cache") is not None:
            parsed["cache"] = strict(PlanCache, parsed["cache"], "the plan's cache")
        return strict(cls, parsed, "the job's plan")


@dataclass(frozen=True)
class JobRow:
    """The job row: Plan's claim (`JobStore.claim_job`), its plan (`record_plan`), the budget
    figures its shards write (`sluice.limits.budget`, nano-USD), and how it ended (`finish_job`). It
    holds no line counts: those are its shard rows' (`JobProgress`)."""

    job_id: str
    # the Step Functions execution that owns the job
    execution: str
    bucket: str
    key: str
    etag: str
    status: str
    started_at: float
    expires_at: int
    plan: PlanFigures | None = None
    shards: int | None = None
    requests: int | None = None
    # only for a job with a spending cap: the cap, what its shards spent plus hold reserved, and
    # what answers cost; `budget_holders` once a shard has reserved (the shards holding a pool)
    budget_cap: int | None = None
    budget_committed: int | None = None
    budget_spent: int | None = None
    budget_holders: int | None = None
    summary: SummaryRow | None = None
    finished_at: float | None = None
    # the job that owned the key and ran when this one was refused (`JobStore.refuse_job`)
    refused_by: str | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> JobRow:
        """The row from its item (numbers already plain), keys aside; an unknown attribute is an error."""
        data = _attributes(item)
        if data.get("plan") is not None:
            data["plan"] = PlanFigures.from_dict(data["plan"])
        if data.get("summary") is not None:
            data["summary"] = SummaryRow.from_dict(data["summary"])
        return strict(cls, data, "job row")

    def as_dict(self) -> dict[str, Any]:
        """The attributes the row holds, as JSON would show them (`sluice status --json`)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v.to_json() if isinstance(v, JsonRecord) else v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class JobProgress:
    """The job row with the lines its shards have checkpointed, done and failed (their rows summed)."""

    job: JobRow
    done: int
    failed: int

    def as_dict(self) -> dict[str, Any]:
        """The row's attributes, then the counts, as `sluice status --json` shows them."""
        return {**self.job.as_dict(), "done": self.done, "failed": self.failed}


@dataclass(frozen=True)
class ItemRow:
    """One line's row (`JobStore.record_progress`): a line that failed, or one out at the provider
    (`provider_id`, a background response or a batch request) until a webhook or a collect settles
    it. A direct line that succeeded has none."""

    shard: int
    line: int
    custom_id: str
    status: str
    attempts: int
    expires_at: int
    provider_id: str | None = None
    error: str | None = None
    # sent again by the shard's last sweep (`sluice.shard.sweep`); the store writes only a True
    swept: bool = False

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> ItemRow:
        """The row from its item (numbers already plain), keys aside; an unknown attribute is an error."""
        values = _attributes(item)
        if ITEM_RESPONSE_ATTRIBUTE in values:
            values["provider_id"] = values.pop(ITEM_RESPONSE_ATTRIBUTE)
        return strict(cls, values, "item row")
