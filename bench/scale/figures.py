"""Every figure of a scenario against its limit: counted calls times rated causes, and the rest.

A DynamoDB item's, a partition key's and an S3 prefix's figure is the sum over causes of (the
cause's occurrences a second at the scenario, `rates`) x (its calls per occurrence on that target,
`counts`) x (units a call, at the item's size there). A target one item is shared by every shard
(the key's limit, the job's row) takes the job's rate of each cause; one a shard has takes a
shard's. Memory and CPU come from the measured peaks (`bench/scale/memory.py`), history events and
Merge's parts from the state machine's definition and the code. Each figure says how it is known:
counted, measured or derived from the definition.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from sluice.contract import causes
from sluice.runners.batch.advance import batch_wait_seconds
from sluice.shard.frame import poll_wait_seconds

from bench.scale import definition, memory
from bench.scale.counts import BY_NAME, CONTINGENT, PerOccurrence, per_occurrence
from bench.scale.rates import Scenario, rate
from bench.scale.runs import VARIANTS

HEADROOM = 0.5
DDB_PARTITION_WCU_PER_S = 1_000
DDB_PARTITION_RCU_PER_S = 3_000
S3_PREFIX_WRITES_PER_S = 3_500
S3_PREFIX_READS_PER_S = 5_500
# Step Functions' API refill rates (us-east-1) for the calls the steps make
SFN_API_PER_S = {"SendTaskSuccess": 300, "SendTaskFailure": 300, "SendTaskHeartbeat": 300}
SECRETS_GET_PER_S = 10_000
HISTORY_EVENTS_MAX = 25_000
# how long a background response may run, and a batch shard wait (Bedrock: a job may wait and run
# for a week and more behind the 20 jobs a model; 10 days is what tests/workflow holds it to)
BACKGROUND_WAIT_S = 600.0
BATCH_WAIT_S = 10 * 86_400.0
S3_WRITES = frozenset(
    {"PutObject", "CopyObject", "DeleteObject", "DeleteObjects", "UploadPart", "CompleteMultipartUpload"}
)
VARIANT_MODE = {v.name: v.mode for v in VARIANTS}


@dataclass(frozen=True)
class Figure:
    name: str
    variant: str
    value: float
    limit: float
    unit: str
    # counted, measured or definition
    known: str
    parts: tuple[tuple[str, float], ...] = ()

    @property
    def share(self) -> float:
        return self.value / self.limit if self.limit else 0.0

    @property
    def over(self) -> bool:
        return self.share > HEADROOM

    def line(self) -> str:
        verdict = "OVER" if self.over else "ok"
        head = (
            f"{verdict:4s} {self.share:6.1%}  {self.name}  [{self.variant}]: "
            f"{_num(self.value)} of {_num(self.limit)} {self.unit} ({self.known})"
        )
        if not self.parts:
            return head
        shown = sorted(self.parts, key=lambda p: (-p[1], p[0]))
        return head + "\n" + "\n".join(f"         {_num(v):>10s}  {name}" for name, v in shown if v > 0)


def counted_figure(name: str, variant: str, by_cause: dict[str, float], limit: float, metric: str) -> Figure:
    """A counted figure: the sum of its causes' parts, in the units of `metric` (`WCU/s`, `reads/s`)."""
    return Figure(
        name, variant, sum(by_cause.values()), limit, metric.split("/")[0], "counted", tuple(by_cause.items())
    )


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}"
    return f"{value:.3g}"


@dataclass(frozen=True)
class Cause:
    """What the runs say of one cause in a variant: its calls per occurrence and how it occurs."""

    cause: causes.Cause
    per_line: int
    period_s: float | None
    every: int | None


def _variant_causes(runs: list[dict[str, Any]]) -> dict[str, Cause]:
    found: dict[str, Cause] = {}
    names = {name for run in runs for name in run["occurrences"]}
    for name in sorted(names):
        cause = BY_NAME.get(name)
        if cause is None:
            continue
        periods = [tuple(p) for run in runs for p in run["periods"].get(name, [])]
        declared = [p for p, _ in periods if p is not None]
        everies = [e for _, e in periods if e is not None]
        per_line = max(Fraction(run["occurrences"].get(name, 0), run["lines"]) for run in runs)
        found[name] = Cause(
            cause,
            per_line=math.ceil(per_line),
            period_s=min(declared) if declared else None,
            every=min(everies) if everies else None,
        )
    return found


@dataclass(frozen=True)
class Target:
    kind: str  # "item", "partition", "prefix"
    name: str
    scope: str  # "job": one for every shard; "shard": one a shard; "spread": one a line or a part
    calls: tuple[PerOccurrence, ...]


def _scope(distinct: int, shards: int) -> str:
    if distinct <= 1:
        return "job"
    if distinct <= shards:
        return "shard"
    return "spread"


def _targets(runs: list[dict[str, Any]], s: Scenario) -> list[Target]:
    small, large = sorted(runs, key=lambda r: r["lines"])[:2]
    ratios = {**per_occurrence(small), **per_occurrence(large)}
    sizes = {
        run["lines"]: {(t["cause"], t["service"], t["operation"], t["shape"]): t for t in run["targets"]}
        for run in runs
    }
    keys: dict[tuple[str, str], set[str]] = defaultdict(set)
    calls: dict[tuple[str, str], list[PerOccurrence]] = defaultdict(list)
    for key, p in ratios.items():
        cause, service, _operation, shape = key
        if BY_NAME.get(cause) is None or BY_NAME[cause].per in CONTINGENT:
            continue
        entry = sizes[large["lines"]].get(key) or sizes[small["lines"]][key]
        concrete = entry["keys"]
        if service == "dynamodb":
            item = shape.split(" (")[0]
            partition = item.split("|")[0] + (" (" + shape.split(" (")[1] if " (" in shape else "")
            for kind, name, mine in (
                ("item", shape, concrete),
                ("partition", partition, [k.split("|")[0] for k in concrete]),
            ):
                keys[(kind, name)].update(mine)
                calls[(kind, name)].append(p)
        elif service == "s3":
            for level in _prefixes(shape):
                keys[("prefix", level)].update(k[: _cut(k, level)] for k in concrete)
                calls[("prefix", level)].append(p)
    found = []
    for (kind, name), mine in sorted(calls.items()):
        scope = _scope(len(keys[(kind, name)]), large["shards"])
        # an item whose sort key carries a number (a line's, a part's) is one of many in its
        # partition, however many a small run happened to write: the partition's figure holds it
        if kind == "item" and (scope == "spread" or "{n}" in name.split("|", 1)[-1]):
            continue
        found.append(Target(kind, name, scope, tuple(mine)))
    return found


def _prefixes(shape: str) -> list[str]:
    return [shape[: i + 1] for i, c in enumerate(shape) if c == "/"]


def _cut(concrete: str, level: str) -> int:
    """Where the concrete key's prefix at the shape's `level` (its n-th `/`) ends."""
    slashes = level.count("/")
    at = -1
    for _ in range(slashes):
        at = concrete.index("/", at + 1)
    return at + 1


def key_figures(variant: str, runs: list[dict[str, Any]], s: Scenario) -> list[Figure]:
    known = _variant_causes(runs)
    found = []
    for target in _targets(runs, s):
        metrics: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for p in target.calls:
            c = known[p.cause]
            r = rate(c.cause, s, service=p.service, per_line=c.per_line, period_s=c.period_s, every=c.every)
            if r is None:
                continue
            each = r.job if target.scope == "job" else r.shard
            if target.scope == "spread" and target.kind != "prefix":
                # a partition a line has: a shard's lines are spread over the table
                each = r.shard
            if target.kind in ("item", "partition"):
                metrics["WCU/s"][p.cause] += each * float(p.write_units)
                metrics["RCU/s"][p.cause] += each * float(p.read_units)
            else:
                metric = "writes/s" if p.operation in S3_WRITES else "reads/s"
                metrics[metric][p.cause] += each * float(p.calls)
        for metric, by_cause in sorted(metrics.items()):
            total = sum(by_cause.values())
            if total <= 0:
                continue
            limit = {
                "WCU/s": DDB_PARTITION_WCU_PER_S,
                "RCU/s": DDB_PARTITION_RCU_PER_S,
                "writes/s": S3_PREFIX_WRITES_PER_S,
                "reads/s": S3_PREFIX_READS_PER_S,
            }[metric]
            label = {"item": "DynamoDB item", "partition": "DynamoDB partition key", "prefix": "S3 prefix"}[target.kind]
            one = {"job": "shared by every shard", "shard": "one a shard", "spread": "one a line"}[target.scope]
            found.append(counted_figure(f"{label} {target.name} ({one}): {metric}", variant, by_cause, limit, metric))
    found.extend(_api_figures(variant, runs, s, known))
    return found


def _api_figures(variant: str, runs: list[dict[str, Any]], s: Scenario, known: dict[str, Cause]) -> list[Figure]:
    """Step Functions' task calls and Secrets Manager's reads, account-wide, at the job's rates."""
    small, large = sorted(runs, key=lambda r: r["lines"])[:2]
    ratios = {**per_occurrence(small), **per_occurrence(large)}
    by_api: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for (cause, service, operation, _), p in ratios.items():
        if service not in ("sfn", "secrets-manager") or cause not in known or BY_NAME[cause].per in CONTINGENT:
            continue
        c = known[cause]
        r = rate(c.cause, s, service=service, per_line=c.per_line, period_s=c.period_s, every=c.every)
        if r is not None:
            by_api[operation][cause] += r.job * float(p.calls)
    found = []
    for operation, by_cause in sorted(by_api.items()):
        limit = SFN_API_PER_S.get(operation) or (SECRETS_GET_PER_S if operation == "GetSecretValue" else None)
        if limit is None:
            continue
        found.append(
            Figure(
                f"{operation} calls",
                variant,
                sum(by_cause.values()),
                limit,
                "a second",
                "counted",
                tuple(by_cause.items()),
            )
        )
    return found


def history_figures(variant: str, s: Scenario) -> list[Figure]:
    mode = VARIANT_MODE[variant]
    loop = definition.mode_loops()[mode]
    if mode == "direct":
        loops = math.ceil(s.settings.shard_lines / s.shard_rate / s.run_s)
        why = f"{loops} run a shard"
    elif mode == "background":
        loops = _loops(lambda t: poll_wait_seconds(s.settings, t), BACKGROUND_WAIT_S)
        why = f"{loops} polls over {BACKGROUND_WAIT_S:g} s"
    else:
        loops = _loops(lambda t: batch_wait_seconds(s.settings, t), BATCH_WAIT_S)
        why = f"{loops} polls over {BATCH_WAIT_S / 86_400:g} days"
    events = definition.child_fixed_events() + loop.events * loops
    return [
        Figure(
            f"history events of a shard's child execution ({why}, {loop.events} a loop)",
            variant,
            events,
            HISTORY_EVENTS_MAX,
            "events",
            "definition",
        )
    ]


def _loops(wait: Any, total_s: float) -> int:
    elapsed, loops = 0.0, 0
    while elapsed < total_s:
        elapsed += max(1, wait(elapsed))
        loops += 1
    return loops


def job_figures(s: Scenario) -> list[Figure]:
    """What a job's size asks of its steps, the same in every mode."""
    found = [
        Figure(
            "Merge's multipart parts",
            "every mode",
            definition.merge_parts(s.lines, s.settings.shard_lines),
            definition.S3_MULTIPART_PARTS_MAX,
            "parts",
            "definition",
        )
    ]
    gathered = definition.gathered_result_bytes(s.shards, 400)
    if gathered is not None:
        found.append(
            Figure(
                "the Map's gathered result", "every mode", gathered, definition.PAYLOAD_MAX_BYTES, "bytes", "definition"
            )
        )
    return found


def memory_figures(path: Path = memory.RECORD, lines: int = memory.TARGET_LINES) -> list[Figure]:
    """Each step's peak resident size and CPU at the maximum, from its measured points: the fit's
    upper bound against half its memory and its timeout."""
    found = []
    for f in sorted(memory.fit(memory.load(path)), key=lambda f: (f.step, f.cache)):
        half_mb, timeout = memory.limits(f.step)
        cache = f"{f.cache:,} cached answers" if f.cache else "an empty cache"
        points = ", ".join(f"{m.lines:,}: {m.peak_mb:.0f} MB" for m in f.points)
        found.append(
            Figure(
                f"{f.step} peak resident size with {cache} (measured at {points})",
                "every mode",
                f.upper_mb_at(lines),
                2 * half_mb,
                "MB",
                "measured",
            )
        )
        found.append(
            Figure(f"{f.step} CPU with {cache}", "every mode", f.upper_cpu_at(lines), timeout, "s", "measured")
        )
    return found


def all_figures(counted: Iterable[dict[str, Any]], scenario_of: Any) -> list[Figure]:
    by_variant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in counted:
        by_variant[run["variant"]].append(run)
    found: list[Figure] = []
    for variant, runs in by_variant.items():
        if not all(run.get("compared", True) for run in runs):
            # its calls a poll are not exact: bounded on paper instead
            continue
        s = scenario_of(VARIANT_MODE[variant])
        found.extend(key_figures(variant, runs, s))
        found.extend(history_figures(variant, s))
    found.extend(job_figures(scenario_of("direct")))
    found.extend(memory_figures())
    return found
