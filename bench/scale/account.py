"""What several jobs at once ask of the account: the table and its index, Step Functions, Lambda,
the webhook endpoint and Bedrock's batch jobs, each summed over every job in flight.

The stated scenario (`stated`): in direct and background mode, JOBS_AT_ONCE jobs on the largest
key Sluice is deployed to keep busy, the prod environment's `provider_rpm` (an OpenAI usage tier 5
organisation's 30,000 requests a minute for gpt-4o-mini). The jobs draw on that key through the
shared rate limit, so together they settle its rate, a quarter each; each job runs the shards
Plan gives a key of that rate (`rate_capped_shards`). In batch mode, BATCH_SHARDS_IN_FLIGHT
shards in flight over the same jobs. A figure sums every cause the runs counted on every target
of its kind (items a line has too), at each job's rate of the cause, over the jobs; what only
races or first uses bring is bounded on paper (`paper.py`), as for one item.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from sluice.plan.job_options import rate_capped_shards
from sluice.providers.bedrock.batch import held_jobs
from sluice.shard.frame import OPENINGS_PER_S

from bench.scale import definition
from bench.scale.counts import BY_NAME, CONTINGENT, per_occurrence
from bench.scale.figures import VARIANT_MODE, Figure, _variant_causes, counted_figure
from bench.scale.rates import MAXIMUM_CACHE, MAXIMUM_LINES, Scenario, environment, rate, scenario
from infra.config import Environment
from infra.config_values import NEW_TABLE_WARM_READS, NEW_TABLE_WARM_WRITES

KEY = "OpenAI usage tier 5, gpt-4o-mini"
JOBS_AT_ONCE = 4
BATCH_SHARDS_IN_FLIGHT = 1_000
# https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/on-demand-capacity-mode-max-throughput.html:
# an on-demand table's reads and writes a second, each, by the account's default table-level quota
DDB_TABLE_UNITS_PER_S = 40_000
# what a new on-demand table (and a new index) serves at once, before it has scaled
DDB_WARM_WCU_PER_S = NEW_TABLE_WARM_WRITES
DDB_WARM_RCU_PER_S = NEW_TABLE_WARM_READS
# https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html: standard workflows'
# state transitions, the account's bucket refill a second in us-east-1, us-west-2 and eu-west-1
# (800 in the other regions), and the open Map Runs of Distributed Maps at once
SFN_TRANSITIONS_PER_S = 5_000
SFN_OPEN_MAP_RUNS = 1_000
# the steps every job runs outside its shards, one Lambda at a time: Plan, Merge, Notify
JOB_STEPS_AT_ONCE = 1


@dataclass(frozen=True)
class Account:
    """The stated scenario of one mode: `jobs` jobs at once, each as `job` says."""

    mode: str
    jobs: int
    key_rpm: float
    job: Scenario

    @property
    def shards_in_flight(self) -> int:
        return self.jobs * self.job.running

    @property
    def line_rate(self) -> float:
        return self.jobs * self.job.line_rate

    def label(self) -> str:
        if self.mode == "batch":
            return (
                f"{self.mode}: {self.jobs} jobs at once, {self.shards_in_flight:,} shards in flight "
                f"({self.job.running:,} a job), {self.job.lines:,} lines a job"
            )
        return (
            f"{self.mode}: {self.jobs} jobs at once on one key at {self.key_rpm:,.0f} RPM ({KEY}), "
            f"{self.line_rate:,.0f} lines a second in all; {self.job.running} shards a job (Plan's cap "
            f"for that key), {self.job.shard_rate:.3g} lines a second a shard; {self.job.lines:,} lines a job"
        )


def stated(mode: str, env: Environment | None = None) -> Account:
    env = env or environment()
    base = scenario(mode, MAXIMUM_LINES, 1, MAXIMUM_CACHE)
    key_rpm = float(env.provider_rpm)
    if mode == "batch":
        job = replace(base, in_flight=math.ceil(BATCH_SHARDS_IN_FLIGHT / JOBS_AT_ONCE))
        return Account(mode, JOBS_AT_ONCE, key_rpm, job)
    shards = rate_capped_shards(env.map_concurrency, key_rpm=key_rpm, concurrency=env.concurrency)
    job = replace(base, in_flight=shards, key_share=key_rpm / 60 / JOBS_AT_ONCE)
    return Account(mode, JOBS_AT_ONCE, key_rpm, job)


def _index_of(shape: str) -> str | None:
    """The index a DynamoDB target's shape names (`table:key| (index)`), or None for the table."""
    if not shape.endswith(")") or " (" not in shape:
        return None
    return shape.rsplit(" (", 1)[1][:-1]


def table_figures(variant: str, runs: list[dict[str, Any]], a: Account, env: Environment) -> list[Figure]:
    """Every DynamoDB unit a second over the jobs at once: the table's and each index's, against
    the table-level quota and the warm throughput it starts with (a new table's, or the table's
    as the environment pre-warms it; an index is not pre-warmed)."""
    small, large = sorted(runs, key=lambda r: r["lines"])[:2]
    ratios = {**per_occurrence(small), **per_occurrence(large)}
    known = _variant_causes(runs)
    sums: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (cause, service, _operation, shape), p in ratios.items():
        if service != "dynamodb" or cause not in known or BY_NAME[cause].per in CONTINGENT:
            continue
        c = known[cause]
        r = rate(c.cause, a.job, service=service, per_line=c.per_line, period_s=c.period_s, every=c.every)
        if r is None:
            continue
        where = _index_of(shape) or "table"
        sums[(where, "WCU/s")][cause] += a.jobs * r.job * float(p.write_units)
        sums[(where, "RCU/s")][cause] += a.jobs * r.job * float(p.read_units)
    found = []
    for (where, metric), by_cause in sorted(sums.items()):
        total = sum(by_cause.values())
        if total <= 0:
            continue
        name = "the jobs table" if where == "table" else f"the jobs table's index {where}"
        warm, of_warm = _warm(where, metric, env)
        for limit, of in ((DDB_TABLE_UNITS_PER_S, "the table-level quota"), (warm, of_warm)):
            found.append(
                counted_figure(
                    f"{name}, {metric} against {of}, {a.jobs} jobs at once", variant, by_cause, limit, metric
                )
            )
    return found


def _warm(where: str, metric: str, env: Environment) -> tuple[int, str]:
    """The warm throughput a figure is held against, and how the report names it."""
    writes = metric == "WCU/s"
    new = DDB_WARM_WCU_PER_S if writes else DDB_WARM_RCU_PER_S
    warmed = env.table_warm_writes_per_s if writes else env.table_warm_reads_per_s
    if where != "table" or not warmed:
        return new, "a new table's warm throughput"
    setting = "table_warm_writes_per_s" if writes else "table_warm_reads_per_s"
    return warmed, f"the table's pre-warmed throughput ({env.name}'s {setting})"


def transition_figures(variant: str, a: Account) -> list[Figure]:
    """State transitions a second over the jobs at once: each shard's loop at its shortest wait,
    and the children the opening waves start."""
    mode = VARIANT_MODE[variant]
    loop = definition.mode_loops()[mode]
    period = a.job.run_s if mode == "direct" else a.job.poll_s
    looping = a.shards_in_flight * loop.transitions / period
    opening = a.jobs * min(float(a.job.running), OPENINGS_PER_S) * definition.child_fixed_transitions()
    parts = (
        (f"each shard's {mode} loop ({loop.transitions} transitions every {period:g} s)", looping),
        (f"the opening waves ({OPENINGS_PER_S:g} children a second a job, their states outside loops)", opening),
    )
    return [
        Figure(
            f"Step Functions state transitions (standard workflows), {a.jobs} jobs at once",
            variant,
            looping + opening,
            SFN_TRANSITIONS_PER_S,
            "a second",
            "definition",
            parts,
        ),
        Figure(f"open Map Runs, {a.jobs} jobs at once", variant, a.jobs, SFN_OPEN_MAP_RUNS, "Map Runs", "definition"),
    ]


def lambda_figure(variant: str, a: Account, env: Environment) -> Figure:
    """Lambda concurrency over the jobs at once: their shard steps (at most the environment's
    `max_shards_in_flight`), their Plan or Merge, and what the webhook reserves."""
    mode = VARIANT_MODE[variant]
    running = a.shards_in_flight if mode != "batch" else math.ceil(a.jobs * a.job.active)
    if mode == "batch":
        # a batch shard runs a Lambda only to submit or collect: the opening waves' submits and
        # the collects of batches that end together
        running += math.ceil(a.jobs * min(float(a.job.running), OPENINGS_PER_S))
    shards = min(running, env.max_shards_in_flight)
    parts = (
        (f"shard steps at once (at most max_shards_in_flight, {env.max_shards_in_flight})", float(shards)),
        ("the webhook receiver's reserved concurrency", float(env.webhook_concurrency)),
        ("Plan, Merge or Notify of each job", float(a.jobs * JOB_STEPS_AT_ONCE)),
    )
    return Figure(
        f"Lambda concurrency, {a.jobs} jobs at once",
        variant,
        sum(v for _, v in parts),
        env.account_concurrency,
        "concurrent executions",
        "definition",
        parts,
    )


def webhook_figure(variant: str, a: Account, env: Environment) -> Figure | None:
    """The webhook endpoint's requests a second: a background response ends in one webhook."""
    if variant != "background by webhook":
        return None
    return Figure(
        f"the webhook API's requests, {a.jobs} jobs at once (stage throttle from provider_rpm)",
        variant,
        a.line_rate,
        env.webhook_rate_limit,
        "a second",
        "definition",
        (("a background response's webhook, one a line", a.line_rate),),
    )


def bedrock_figure(a: Account, env: Environment) -> Figure:
    """Bedrock batch inference jobs in progress or submitted at once on one model, when every
    batch shard in flight is Bedrock's on the same model: each part holds one job in the batch
    queue's slots before it is created, and the slots hold half the environment's quota."""
    held = held_jobs(env.bedrock_batch_jobs_quota)
    jobs = min(a.shards_in_flight, held)
    return Figure(
        f"Bedrock batch inference jobs a model, {a.shards_in_flight:,} batch shards on one model",
        "batch",
        jobs,
        env.bedrock_batch_jobs_quota,
        "jobs",
        "definition",
        (("a batch shard's part submitted, once it holds one of the batch queue's job slots", float(jobs)),),
    )


def account_figures(counted: list[dict[str, Any]], env: Environment | None = None) -> list[Figure]:
    env = env or environment()
    by_variant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in counted:
        by_variant[run["variant"]].append(run)
    found: list[Figure] = []
    for variant, runs in sorted(by_variant.items()):
        if not all(run.get("compared", True) for run in runs):
            # a run whose calls depend on timing (a cancel, a cutover, a full queue): bounded on paper
            continue
        a = stated(VARIANT_MODE[variant], env)
        found.extend(table_figures(variant, runs, a, env))
        found.extend(transition_figures(variant, a))
        found.append(lambda_figure(variant, a, env))
        webhook = webhook_figure(variant, a, env)
        if webhook is not None:
            found.append(webhook)
    found.append(bedrock_figure(stated("batch", env), env))
    return found


def scenario_lines(env: Environment | None = None) -> list[str]:
    return [stated(mode, env).label() for mode in ("direct", "background", "batch")]


__all__ = ["Account", "account_figures", "scenario_lines", "stated"]
