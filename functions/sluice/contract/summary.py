"""The job's summary, `<name>.summary.json`: what Merge, MarkFailed and a cancel write when a job
ends, and what the CLI, the report and a user's own tools read. The types here produce it
(`Summary.to_json`); readers read the JSON. Merge adds it up from each shard's `stats.json`
(`ShardStats`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from .state import strict

# The summary's key for a provider that refused a shard's requests (issue 31): `null`, or a
# `ProviderRefused` as a JSON object. The CLI exits 8 when it is set.
PROVIDER_REFUSED = "provider_refused"


class JsonRecord:
    """A frozen dataclass written as a JSON object, its fields in order. A field in `OPTIONAL`
    is left out while it is None: a key a reader finds only when it applies."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {
            f.name: _plain(getattr(self, f.name))
            for f in fields(self)  # type: ignore[arg-type]
            if not (f.name in self.OPTIONAL and getattr(self, f.name) is None)
        }


def _plain(value: Any) -> Any:
    if isinstance(value, JsonRecord):
        return value.to_json()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return dict(value)
    return value


@dataclass(frozen=True)
class ProviderRefused(JsonRecord):
    """Why a shard stopped sending: the first answers of its run were all this one non-retryable
    error. `status` is the HTTP status, `message` the provider's error message, `cause` the likely
    cause in plain words, `lines` the lines not sent because of it, or given up in flight (in the
    summary, the job's)."""

    status: int
    message: str
    cause: str
    lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return self.to_json()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProviderRefused:
        return strict(cls, data, PROVIDER_REFUSED)


@dataclass(frozen=True)
class Counts(JsonRecord):
    """Every input line: `requests` are the lines not blank, each a result or an error."""

    lines: int
    blank: int
    requests: int
    results: int
    errors: int


@dataclass(frozen=True)
class Tokens(JsonRecord):
    input: int
    output: int


@dataclass(frozen=True)
class Sweep(JsonRecord):
    """Lines whose attempts ran out on transient failures, sent once more at the shard's end."""

    swept: int
    recovered: int


@dataclass(frozen=True)
class CacheFigures(JsonRecord):
    """Lines the response cache answered (not sent, not paid), lines sent, and what the hits
    would have cost."""

    mode: str
    hits: int
    misses: int
    saved_usd: float | None


@dataclass(frozen=True)
class Latency(JsonRecord):
    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True)
class Costs(JsonRecord):
    """The job's estimate in US dollars: the provider's as run, all direct and all batch, what
    batching saved against all direct, and AWS's."""

    provider: float | None
    provider_all_direct: float | None
    provider_all_batch: float | None
    batch_savings: float | None
    aws: float


@dataclass(frozen=True)
class Budget(JsonRecord):
    """The job's spending cap, what the answers cost at list prices as the shards counted it
    against the cap, and the lines left unsent when it ran out."""

    cap_usd: float
    spent_usd: float
    unsent_lines: int


@dataclass(frozen=True)
class ShardCosts(JsonRecord):
    """A shard's provider estimate as run, and what its tokens cost all direct and all batch."""

    as_run: float | None
    all_direct: float | None
    all_batch: float | None


@dataclass(frozen=True)
class BatchRun(JsonRecord):
    id: str
    status: str | None
    turnaround_s: float | None


@dataclass(frozen=True)
class ShardBatches(JsonRecord):
    """A batch-mode shard's batches, the rows none finished that RunShard then sent directly, and
    the batches the provider refused for a full queue and that were created again."""

    batches: list[BatchRun]
    direct_fallback_lines: int
    requeued: int


@dataclass(frozen=True, kw_only=True)
class ShardStats(JsonRecord):
    """A finished shard's `stats.json` (`ShardSpec.stats_key`): its line counts, which Merge
    checks against the plan, the sizes of its results and errors, which spare Merge a HEAD of
    each (None in a file written before it had them), and its figures as `sluice.shard.stats.Stats`
    writes them (this package reads no further: it imports the standard library only)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"results_bytes", "errors_bytes", "failure"})
    result_lines: int
    error_lines: int
    results_bytes: int | None = None
    errors_bytes: int | None = None
    stats: dict[str, Any]
    # why the shard failed after its retries (ShardFailed wrote its outputs), as `Type: message`
    failure: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardStats:
        return strict(cls, data, "a shard's stats.json")


@dataclass(frozen=True)
class ShardFigures(JsonRecord):
    """One shard's line in the summary. `swept`: lines its last sweep sent once more;
    `recovered`: those that became results. `batch` only for a shard that ran batches; `choice` and
    `why` only in a deadline job: what its plan chose for the shard (batch, flex, direct) and why;
    `failure` only for a shard that failed after its retries: why."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"batch", "choice", "why", "failure"})
    shard: int
    mode: str
    first_line: int
    lines: int
    results: int
    errors: int
    swept: int
    recovered: int
    batch: ShardBatches | None
    paths: dict[str, int]
    provider_cost_usd: ShardCosts
    choice: str | None = None
    why: str | None = None
    failure: str | None = None


@dataclass(frozen=True)
class Figures(JsonRecord):
    """What a merge of the job's shards found, every line accounted for. `lines_by_path`: lines the
    provider answered, by how they went; `error_examples`: one message a code; `latency_histogram`
    and `timeline`: what the report draws; `merge`: the requests and bytes the outputs took.
    `budget` only for a job with a cap; `provider_refused` always, null unless one refused;
    `deadline` only for a deadline job (`DeadlineFigures`)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"budget", "validation", "deadline", "retries_by_cause"})
    outputs: dict[str, str]
    counts: Counts
    error_rate: float
    max_error_rate: float
    lines_by_path: dict[str, int]
    errors_by_code: dict[str, int]
    error_examples: dict[str, str]
    tokens: Tokens
    attempts: int
    retries: int
    # how many attempts the longest line took
    max_line_attempts: int
    throttled: int
    sweep: Sweep
    cache: CacheFigures
    latency_s: Latency
    latency_histogram: list[dict[str, float | int]]
    timeline: dict[str, object]
    started_at: float
    wall_seconds: float
    plan_seconds: float | None
    mode: str | None
    shards: list[ShardFigures]
    merge: dict[str, int]
    cost_estimate_usd: Costs
    budget: Budget | None
    provider_refused: ProviderRefused | None
    # a validating job's lines by how they ended, and the answers each check turned down
    # (`sluice.send.output_check`); None for a job that validates nothing
    validation: dict[str, int] | None = None
    deadline: DeadlineFigures | None = None
    # the retries by what the attempt before met: 429s (and the like), 5xx answers, connections lost
    # or timed out; a job that retried nothing has none
    retries_by_cause: dict[str, int] | None = None


@dataclass(frozen=True)
class DeadlineFigures(JsonRecord):
    """A deadline job's plan next to how it ran: when it had to end and when it did (`met`), the
    cutover late batches were cancelled at, the batch turnaround planned on and where that figure
    came from, the shards by choice, and the provider's cost as planned, as run, all direct and all
    batch (the run's from its tokens, as `cost_estimate_usd`). `flex_fallback_lines`: lines of its flex
    shards that went on at the standard tier, at list price (flex had no capacity, or the model
    refused it)."""

    deadline: str
    ended_at: str
    met: bool
    cutover_at: str | None
    expected_finish: str
    batch_turnaround_s: float
    batch_turnaround_source: str
    shards_by_choice: dict[str, int]
    planned_usd: float | None
    as_run_usd: float | None
    all_direct_usd: float | None
    all_batch_usd: float | None
    flex_fallback_lines: int = 0


@dataclass(frozen=True)
class SummaryRow(JsonRecord):
    """What the job row keeps of its summary (`JobStore.finish_job`): enough for `sluice status`
    and a cancel that finds the job already ended, without reading the object. A merged job's
    counts, outputs, wall time and budget (`budget` only with a cap); else why it ended before
    it had any (`error`)."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"counts", "outputs", "wall_seconds", "budget", "error"})
    counts: Counts | None = None
    outputs: dict[str, str] | None = None
    wall_seconds: float | None = None
    budget: Budget | None = None
    error: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SummaryRow:
        parsed = dict(data)
        if parsed.get("counts") is not None:
            parsed["counts"] = strict(Counts, parsed["counts"], "the job row's counts")
        if parsed.get("budget") is not None:
            parsed["budget"] = strict(Budget, parsed["budget"], "the job row's budget")
        return strict(cls, parsed, "the job row's summary")


@dataclass(frozen=True)
class JobFailed(JsonRecord):
    """The detail of the "Sluice Job Failed" event MarkFailed publishes once the job ended FAILED:
    why (`error`), then what it left: a merged job's `counts` and `outputs`, or the `summary`
    alone of one that ended before it had any."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"counts", "outputs", "summary"})
    job_id: str
    status: str
    error: str
    counts: Counts | None = None
    outputs: dict[str, str] | None = None
    summary: str | None = None


@dataclass(frozen=True)
class Summary:
    """A job's summary as it ended. `figures` when its shards were merged (every line accounted
    for); None when it ended before it had any (Plan failed, or cancelled while planning), and then
    `error` says why. A merged job carries `error` only when it failed or was cancelled."""

    job_id: str
    status: str
    input: str
    figures: Figures | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.figures is None:
            return {"job_id": self.job_id, "status": self.status, "error": self.error, "input": self.input}
        merged = {"job_id": self.job_id, "status": self.status, "input": self.input, **self.figures.to_json()}
        if self.error:
            merged["error"] = self.error
        return merged

    def row(self) -> SummaryRow:
        """What the job row keeps of it (`JobStore.finish_job`)."""
        if self.figures is None:
            return SummaryRow(error=self.error)
        figures = self.figures
        return SummaryRow(
            counts=figures.counts, outputs=figures.outputs, wall_seconds=figures.wall_seconds, budget=figures.budget
        )
