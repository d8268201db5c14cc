"""The job's summary: what its shards' outputs add up to, and the one place a summary is written.

Merge, MarkFailed and a cancel all end a job through `end_job`, whether its shards were merged
or it ended before it had any."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import orjson

from sluice.contract import (
    BatchRun,
    Budget,
    CacheFigures,
    Costs,
    Counts,
    DeadlineFigures,
    Figures,
    JobRow,
    Latency,
    Mode,
    ProviderRefused,
    ShardBatches,
    ShardFigures,
    ShardSpec,
    Summary,
    Sweep,
    Tokens,
    causes,
    deadline_plan_key,
    summary_key,
)
from sluice.contract.model import ErrorCode
from sluice.core.costs import aws_cost_usd, padded, provider_cost_usd, provider_costs
from sluice.limits.budget import nano_to_usd
from sluice.merge.outputs import ShardOutput
from sluice.plan.deadline import AtLeast, iso
from sluice.send.refusal import read_refusal
from sluice.shard.stats import Stats
from sluice.store.jobs import JobStore


class InvariantError(RuntimeError):
    """The outputs do not account for every input line exactly once; the job must not succeed."""


@dataclass
class Tally:
    """What the shards' outputs add up to, read shard by shard in the manifest's order."""

    totals: Stats = field(default_factory=Stats)
    # the tokens batches answered, priced at the batch rate
    batch_totals: Stats = field(default_factory=Stats)
    # the tokens the cache answered, by the rate their shard would have paid to send them
    direct_hits: Stats = field(default_factory=Stats)
    batch_hits: Stats = field(default_factory=Stats)
    shards: list[ShardFigures] = field(default_factory=list)
    result_lines: int = 0
    error_lines: int = 0
    # what each shard wrote, by the size its stats give (none before they carried one)
    result_sizes: list[int | None] = field(default_factory=list)
    error_sizes: list[int | None] = field(default_factory=list)
    # what the first shard a refusing provider stopped says of it (one note read, not one a shard)
    refused: ProviderRefused | None = None
    # shards this call assembled from the parts they left
    assembled: int = 0
    # the batches' turnarounds (created to completed; cancelled or expired ones as `AtLeast`), by
    # the model each ran
    measured: dict[str | None, list[float]] = field(default_factory=dict)

    def add(self, s3: Any, output: ShardOutput) -> None:
        """Count one shard's output in; InvariantError if it does not account for its lines."""
        spec, figures = output.spec, output.figures
        self.assembled += output.assembled
        stats = Stats.from_dict(figures.stats)
        self.totals.merge(stats)
        if self.refused is None and stats.errors.get(ErrorCode.PROVIDER_REFUSED):
            self.refused = read_refusal(s3, spec.bucket, spec.refusal_key)
        (self.batch_hits if spec.mode == Mode.BATCH else self.direct_hits).merge(
            Stats(cached_models=stats.cached_models)
        )
        results, errors = figures.result_lines, figures.error_lines
        if results + errors != spec.lines - spec.blank:
            raise InvariantError(
                f"shard {spec.shard} accounts for {results + errors} lines of {spec.lines - spec.blank}"
            )
        self.result_lines += results
        self.error_lines += errors
        self.result_sizes.append(figures.results_bytes)
        self.error_sizes.append(figures.errors_bytes)
        batch_models: dict[str, list[int]] = output.report.get("batch_models", {}) if output.report else {}
        for batch in (output.report or {}).get("batches", []):
            if batch.get("measured_s") is not None:
                self.measured.setdefault(batch.get("model"), []).append(float(batch["measured_s"]))
            elif batch.get("censored_s") is not None:
                self.measured.setdefault(batch.get("model"), []).append(AtLeast(batch["censored_s"]))
        discounted = batch_priced(stats, batch_models)
        self.batch_totals.merge(Stats(models=discounted))
        self.shards.append(
            replace(shard_figures(spec, stats, (results, errors), output.report, discounted), failure=figures.failure)
        )

    @property
    def unsent(self) -> int:
        """Lines the job's budget left unsent."""
        return self.totals.errors.get(ErrorCode.BUDGET_EXCEEDED, 0)


def batch_priced(stats: Stats, batch_models: Mapping[str, list[int]]) -> dict[str, list[int]]:
    """The tokens of a shard's answers billed at Batch API prices, by model: those its batches
    answered and those served at flex, never more than the shard's answers took (a batch's row that
    says it was served at flex is counted once)."""
    discounted: dict[str, list[int]] = {}
    for model in batch_models.keys() | stats.batch_priced_models.keys():
        batched = padded(batch_models.get(model, []))
        flex = padded(stats.batch_priced_models.get(model, []))
        ceiling = padded(stats.models.get(model, []))
        counts = [min(max(c, b), b + f) for c, b, f in zip(ceiling, batched, flex, strict=True)]
        discounted[model] = counts if any(counts[2:]) else counts[:2]
    return discounted


def shard_figures(
    spec: ShardSpec,
    stats: Stats,
    lines: tuple[int, int],
    report: Mapping[str, Any] | None,
    batch_models: dict[str, list[int]],
) -> ShardFigures:
    """One shard's line in the summary: `lines` are its (results, errors)."""
    batch = None
    if report:
        batch = ShardBatches(
            batches=[
                BatchRun(id=b["id"], status=b.get("status"), turnaround_s=b.get("turnaround_s"))
                for b in report.get("batches", [])
            ],
            direct_fallback_lines=report.get("fallback_lines", 0),
            requeued=report.get("requeued", 0),
        )
    return ShardFigures(
        shard=spec.shard,
        mode=spec.mode,
        first_line=spec.first_line,
        lines=spec.lines,
        results=lines[0],
        errors=lines[1],
        swept=stats.swept,
        recovered=stats.recovered_by_sweep,
        batch=batch,
        paths=dict(sorted(stats.paths.items())),
        provider_cost_usd=provider_costs(stats.models, batch_models),
    )


def _saved_usd(direct_hits: Stats, batch_hits: Stats) -> float | None:
    """What the hits would have cost this job: at the Batch API's rate in a shard that batches
    (a batch job's re-run saves what the batch cost), at the direct rate in any other."""
    direct = provider_cost_usd(direct_hits.cached_models)
    batch = provider_cost_usd(batch_hits.cached_models, batch=True)
    if direct is None and batch is None:
        return None
    return round((direct or 0.0) + (batch or 0.0), 6)


def _costs(tally: Tally, counts: Counts, *, shards: int, wall: float) -> Costs:
    run = provider_costs(tally.totals.models, tally.batch_totals.models)
    return Costs(
        provider=run.as_run,
        provider_all_direct=run.all_direct,
        provider_all_batch=run.all_batch,
        # what batching saved against sending everything directly
        batch_savings=None if run.as_run is None or run.all_direct is None else round(run.all_direct - run.as_run, 6),
        aws=aws_cost_usd(requests=counts.requests, shards=shards, wall_seconds=wall, failed=counts.errors),
    )


def _budget(job: JobRow | None, unsent: int) -> Budget | None:
    if job is None or not job.budget_cap:
        return None
    return Budget(
        cap_usd=nano_to_usd(job.budget_cap), spent_usd=nano_to_usd(job.budget_spent or 0), unsent_lines=unsent
    )


def job_figures(
    tally: Tally,
    *,
    counts: Counts,
    outputs: dict[str, str],
    moved: dict[str, int],
    job: JobRow | None,
    max_error_rate: float,
    started: float,
    wall: float,
) -> Figures:
    """What the merge found: `job` is the job row, whose `plan` says how it was planned."""
    totals = tally.totals
    plan = job.plan if job else None
    refused_lines = totals.errors.get(ErrorCode.PROVIDER_REFUSED, 0)
    return Figures(
        outputs=outputs,
        counts=counts,
        error_rate=round(counts.errors / counts.requests, 6) if counts.requests else 0.0,
        max_error_rate=max_error_rate,
        lines_by_path=dict(sorted(totals.paths.items())),
        errors_by_code=dict(sorted(totals.errors.items())),
        error_examples=dict(sorted(totals.error_examples.items())),
        tokens=Tokens(input=totals.tokens_in, output=totals.tokens_out),
        attempts=totals.attempts,
        retries=totals.retries,
        max_line_attempts=totals.max_attempts,
        throttled=totals.throttled,
        retries_by_cause=(
            {"throttled": totals.throttled, "server_error": totals.server_errors, "connection": totals.lost}
            if totals.throttled or totals.server_errors or totals.lost
            else None
        ),
        sweep=Sweep(swept=totals.swept, recovered=totals.recovered_by_sweep),
        cache=CacheFigures(
            mode=plan.cache.mode if plan else "off",
            hits=totals.cached,
            misses=sum(totals.paths.values()) - totals.cached,
            saved_usd=_saved_usd(tally.direct_hits, tally.batch_hits) if totals.cached else 0.0,
        ),
        latency_s=Latency(p50=totals.percentile_s(0.5), p95=totals.percentile_s(0.95), p99=totals.percentile_s(0.99)),
        latency_histogram=totals.latency_histogram(),
        timeline=totals.timeline_dict(),
        started_at=started,
        wall_seconds=wall,
        plan_seconds=plan.plan_seconds if plan else None,
        mode=plan.mode if plan else None,
        shards=tally.shards,
        merge=moved,
        cost_estimate_usd=_costs(tally, counts, shards=len(tally.shards), wall=wall),
        budget=_budget(job, tally.unsent),
        provider_refused=replace(tally.refused, lines=refused_lines) if tally.refused and refused_lines else None,
        validation=dict(sorted(totals.validation.items())) if totals.validation else None,
    )


@causes.under(causes.MERGE, causes.MARK_FAILED, causes.CANCEL)
def end_job(s3: Any, store: JobStore | None, summary: Summary, *, bucket: str, prefix: str) -> str:
    """The one writer of a job's summary: the object under `summary_key(prefix)`, then the job
    row's final status and what it keeps of the summary (`store` None: Plan failed before there
    was a row). Returns the summary's key."""
    key = summary_key(prefix)
    s3.put_object(
        Bucket=bucket,
        Key=key,
        Body=orjson.dumps(summary.to_json(), option=orjson.OPT_INDENT_2),
        ContentType="application/json",
    )
    if store is not None:
        store.finish_job(summary)
    return key


def with_deadline(
    s3: Any, bucket: str, job_id: str, specs: list[ShardSpec], figures: Figures, now: float, *, flex_fallback: int = 0
) -> Figures:
    """A deadline job's figures with its plan beside them: each shard's choice and why, and the job's
    `DeadlineFigures` (`flex_fallback`: the lines its flex shards sent at the standard tier). One read
    of the plan Plan wrote, for a deadline job only."""
    if not any(spec.choice for spec in specs):
        return figures
    with causes.because(causes.MERGE):
        plan = orjson.loads(s3.get_object(Bucket=bucket, Key=deadline_plan_key(job_id))["Body"].read())
    whys = {int(s["shard"]): str(s["why"]) for s in plan.get("shards", [])}
    choices = {spec.shard: spec.choice for spec in specs}
    shards = [replace(s, choice=choices.get(s.shard) or None, why=whys.get(s.shard)) for s in figures.shards]
    deadline = datetime.fromisoformat(plan["deadline"]).timestamp()
    costs = figures.cost_estimate_usd
    return replace(
        figures,
        shards=shards,
        deadline=DeadlineFigures(
            deadline=plan["deadline"],
            ended_at=iso(now),
            met=now <= deadline,
            cutover_at=plan.get("cutover_at"),
            expected_finish=plan["expected_finish"],
            batch_turnaround_s=float(plan["batch_turnaround_s"]),
            batch_turnaround_source=str(plan["batch_turnaround_source"]),
            shards_by_choice=dict(sorted(Counter(c for c in choices.values() if c).items())),
            planned_usd=plan.get("cost_usd"),
            as_run_usd=costs.provider,
            all_direct_usd=costs.provider_all_direct,
            all_batch_usd=costs.provider_all_batch,
            flex_fallback_lines=flex_fallback,
        ),
    )
