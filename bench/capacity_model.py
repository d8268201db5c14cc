"""The capacity model: what the measured runs say a job of any size asks of AWS, against its limits.

Every count the runs recorded (`capacity_runs`) is fitted, by non-negative least squares, as

    count = a·lines + b·shards + r·runs + c·shard-seconds + d

(runs: provider-step invocations, a shard's loops; shard-seconds: the time the shards' Lambdas
ran), per mode, per DynamoDB item, partition key and index key and per S3 prefix, each by its
shape (`capacity_runs.shape`). At a scenario's size the lines come at the job's pace, the shards
in flight each add what a shard does beyond its lines, and the busiest few seconds of any one
shard beyond its lines (`capacity_runs.WINDOW_S`) are taken to happen in every shard at once, as
they do when a job ends together, except its opening (its calls within `capacity_runs.OPENING_S` of
its first): the first wave opens `OPENINGS_PER_S` shards a second (`sluice.shard.opening_delay_s`),
so a window holds the openings of at most `OPENINGS_PER_S * (WINDOW_S + OPENING_S)` shards, and the
others are at their busiest later window. A key
the runs saw written from several shards takes all the shards in flight; a key of one shard
takes one shard's; a key per line (an item row, a response id) holds what one line does to it.
An item's size is fitted against the shards in flight, the shards or the lines, whichever
explains it (or none), and its units per call follow its size: writes per 1 KB, reads per 4 KB.

Plan, Merge, Notify and MarkFailed run once a job: their calls, CPU seconds and memory are
fitted against the lines, shards, shard-seconds and the answers in the cache, and their time
on AWS is their CPU, each call at AWS's latency, and their bytes at one stream's pace.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.budget import holders_poll_s
from sluice.cache_compact import SLICE_S
from sluice.contract import CACHE_PREFIX, PROVIDER_STEPS, STEPS
from sluice.merge import plan_parts
from sluice.shard import OPENINGS_PER_S

# the intercept first: of fits as good, the one that explains the most by a constant wins
FEATURES = ("one", "lines", "shards", "runs", "shard_seconds")
MODES = ("direct", "background", "batch")
# the provider step a shard of each mode starts in
SHARD_STEP = {"direct": "run_shard", "background": "submit", "batch": "submit_batch"}
# callers, in the runs' aggregates, that act while shards run: the shards, and webhooks per line
SHARD_PHASE = "shard"
# the job's own steps, once a job each
JOB_STEPS = ("plan", "merge", "notify", "mark_failed")
WINDOW_S = 5.0
# a shard's calls within this long of its first are its opening (`capacity_runs.OPENING_S`)
OPENING_S = 1.0
# the fastest a shard may go, lines a second, for its busiest windows to count (`near_the_keys_share`)
SHARD_PACE_MAX = 2.0
# an item's size that moved less than this over the runs did not grow with them
SIZE_GROWTH_BYTES = 64

# --- AWS limits -----------------------------------------------------------------------------
# https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html
DDB_PARTITION_WCU_PER_S = 1_000
DDB_PARTITION_RCU_PER_S = 3_000
# https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html
DDB_ITEM_BYTES = 400 * 1024
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html
S3_PREFIX_PUT_PER_S = 3_500
S3_PREFIX_GET_PER_S = 5_500
# https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html (the account's default; soft)
LAMBDA_ACCOUNT_CONCURRENCY = 1_000
# https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html, API action throttling:
# refill rates a second outside us-east-1, us-west-2 and eu-west-1, where they are lowest (soft)
SFN_API_PER_S = {"StartExecution": 150, "SendTaskSuccess": 300, "SendTaskFailure": 300, "SendTaskHeartbeat": 300}
SFN_TRANSITIONS_PER_S = 500
HISTORY_EVENTS_MAX = 25_000
# the share of any limit a figure may take at the documented maximum
HEADROOM = 0.5

# --- AWS's pace, where the local cloud is faster or slower than AWS (assumptions) ------------
# a small request's round trip from a Lambda, the slower end of what AWS gives: S3 10-20 ms
# (issue 30: 54,000 GETs in 9-18 minutes), DynamoDB single-digit milliseconds
CALL_LATENCY_S = {"s3": 0.020, "dynamodb": 0.010}
OTHER_CALL_LATENCY_S = 0.020
# one S3 stream into or out of a Lambda
STREAM_BYTES_PER_S = 90e6
# what a Lambda process holds before its handler allocates anything (local.quotas.LAMBDA_RUNTIME_MB)
RUNTIME_BYTES = 72 * 2**20

# --- the scenarios (issue 30) ---------------------------------------------------------------
LINES = (100_000, 1_000_000, 10_000_000)
IN_FLIGHT = (10, 100, 1_000)
CACHES = (0, 10_000_000, 100_000_000)
PROVIDER_LATENCY_S = 1.0
PER_SHARD_IN_FLIGHT = 950
KEY_RPM = 30_000
# how long a background response and a batch take at the provider: they set how often a shard wakes
BACKGROUND_RESPONSE_S = 600.0
BATCH_TURNAROUND_S = 3_600.0
MAXIMUM = (10_000_000, 1_000, 100_000_000)


# ---- fitting


def _solve(rows: list[list[float]], ys: list[float]) -> list[float] | None:
    """Least squares by the normal equations (a few unknowns); None when they are singular."""
    n = len(rows[0])
    a = [
        [sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys, strict=True))]
        for i in range(n)
    ]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-9 * max(1.0, max(abs(x) for x in a[pivot][:n])):
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def nnls(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Non-negative least squares for a few features, the features chosen by the Bayesian
    information criterion: of the subsets whose own least-squares fit has no negative coefficient,
    the one that explains the runs best for the fewest features. A feature the runs merely
    happen to move with (a step's CPU and the shard-seconds that followed it) stays out unless
    it explains much more than it costs."""
    n = len(rows[0]) if rows else 0
    runs = len(rows)
    floor = 1e-9 * (1.0 + sum(y * y for y in ys))

    def score(residual: float, size: int) -> float:
        return runs * math.log(max(residual, floor) / max(runs, 1)) + size * math.log(max(runs, 2))

    best: tuple[float, list[float]] = (score(sum(y * y for y in ys), 0), [0.0] * n)
    for size in range(1, min(n, runs) + 1):
        for subset in itertools.combinations(range(n), size):
            solved = _solve([[row[i] for i in subset] for row in rows], list(ys))
            if solved is None or min(solved) < 0:
                continue
            coefficients = [0.0] * n
            for i, value in zip(subset, solved, strict=True):
                coefficients[i] = value
            residual = sum(
                (y - sum(c * x for c, x in zip(coefficients, row, strict=True))) ** 2
                for row, y in zip(rows, ys, strict=True)
            )
            if score(residual, size) < best[0] - 1e-9:
                best = (score(residual, size), coefficients)
    return best[1]


def _row(features: Mapping[str, float], names: Sequence[str]) -> list[float]:
    derived = {"one": 1.0, "lines_per_shard": features.get("lines", 0.0) / max(1.0, features.get("shards", 1.0))}
    return [float(derived[name]) if name in derived else float(features.get(name, 0.0)) for name in names]


@dataclass(frozen=True)
class Fit:
    names: tuple[str, ...]
    coefficients: tuple[float, ...]

    def __call__(self, features: Mapping[str, float]) -> float:
        return sum(c * x for c, x in zip(self.coefficients, _row(features, self.names), strict=True))

    def of(self, name: str) -> float:
        return self.coefficients[self.names.index(name)] if name in self.names else 0.0

    @classmethod
    def of_runs(cls, runs: Sequence[Mapping[str, Any]], values: Sequence[float], names: Sequence[str]) -> Fit:
        return cls(tuple(names), tuple(nnls([_row(run["features"], names) for run in runs], values)))


# ---- the scenario


@dataclass(frozen=True)
class Scenario:
    lines: int
    in_flight: int
    cached: int
    mode: str
    shard_lines: int
    # how long a shard's run sends before it drains (the Lambda timeout less the margin it keeps)
    run_s: float
    # the shards' own backoff between polls: (seconds waited so far) -> the next wait
    poll: Callable[[float], float]
    # batch mode: a shard's invocation's seconds, as the runs measured them (their Lambdas mostly wait)
    batch_run_s: float = 0.0

    @property
    def shards(self) -> int:
        return math.ceil(self.lines / self.shard_lines)

    @property
    def running(self) -> int:
        """Shards in flight: as many as asked, or all of the job's if it has fewer."""
        return min(self.in_flight, self.shards)

    @property
    def pace(self) -> float:
        """Lines a second: what the shards keep in flight over the latency, within the key's limit; in
        batch mode, the job's lines over the batches' turnaround."""
        if self.mode == "batch":
            return self.lines / BATCH_TURNAROUND_S
        return min(self.running * PER_SHARD_IN_FLIGHT / PROVIDER_LATENCY_S, KEY_RPM / 60)

    @property
    def wall(self) -> float:
        return self.lines / self.pace

    def wakeups(self, seconds: float) -> int:
        elapsed, count = 0.0, 0
        while elapsed < seconds:
            elapsed += max(1.0, self.poll(elapsed))
            count += 1
        return count

    @property
    def runs_per_shard(self) -> int:
        if self.mode == "batch":
            return 2 + self.wakeups(BATCH_TURNAROUND_S)
        sending = math.ceil(self.shard_lines / (self.pace / self.running) / self.run_s)
        if self.mode == "background":
            return sending + self.wakeups(BACKGROUND_RESPONSE_S)
        return sending

    @property
    def shard_seconds(self) -> float:
        """The shards' Lambdas' seconds: sending the whole time (direct), sending and collecting at the
        same pace (background), each run as long as the runs measured (batch)."""
        if self.mode == "batch":
            return self.shards * self.runs_per_shard * self.batch_run_s
        return (2.0 if self.mode == "background" else 1.0) * self.running * self.wall

    def features(self) -> dict[str, float]:
        return {
            "per_shard": PER_SHARD_IN_FLIGHT,
            "lines": self.lines,
            "shards": self.shards,
            "runs": self.shards * self.runs_per_shard,
            "shard_seconds": self.shard_seconds,
            "cached": self.cached,
            "in_flight": self.running,
            "lines_per_shard": self.lines / self.shards,
            "one": 1.0,
            **by_mode(self.mode, self.lines, self.shards),
        }


def by_mode(mode: str, lines: float, shards: float) -> dict[str, float]:
    """The lines and shards again, by mode: what a line leaves in the outputs differs from mode to
    mode (a Responses answer is not a chat completion's), and so do a shard's (a batch shard's
    report), and a step that reads them all sees it."""
    found = {}
    for m in MODES:
        found[f"{m}_lines"] = float(lines) if m == mode else 0.0
        found[f"{m}_shards"] = float(shards) if m == mode else 0.0
    return found


def steady(fit: Fit, scenario: Scenario) -> float:
    """The fitted count's rate while the shards run: per line at the job's pace, per shard and
    run as they start, per shard-second over the shards in flight."""
    f = scenario.features()
    started = (fit.of("shards") * f["shards"] + fit.of("runs") * f["runs"] + fit.of("one")) / scenario.wall
    return fit.of("lines") * scenario.pace + fit.of("shard_seconds") * f["shard_seconds"] / scenario.wall + started


# ---- figures


@dataclass(frozen=True)
class Figure:
    """One figure against one limit, with the callers that make it up."""

    name: str
    mode: str
    value: float
    limit: float
    unit: str
    parts: tuple[tuple[str, float], ...] = ()
    # a cap the design sets and means to reach (what waits past it waits, and fails nothing): shown,
    # held to no headroom
    cap: bool = False

    @property
    def share(self) -> float:
        return self.value / self.limit if self.limit else 0.0

    @property
    def over(self) -> bool:
        """Past the headroom a figure may take at the documented maximum."""
        return self.share > HEADROOM and not self.cap

    def describe(self) -> str:
        text = f"{self.name} [{self.mode}]: {_num(self.value)} {self.unit} of {_num(self.limit)} ({self.share:.0%})"
        text += " (a cap, by design)" if self.cap else ""
        top = ", ".join(f"{name} {_num(value)}" for name, value in self.parts[:4] if value >= 0.05 * self.value)
        return f"{text}; from {top}" if top else text


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 10 else f"{value:,.2g}"


@dataclass(frozen=True)
class KeyClass:
    """What the shards of one mode do to the keys of one shape (or to one S3 prefix), fitted."""

    kind: str  # ddb-item | ddb-partition | ddb-index | s3-prefix
    shape: str
    scope: str  # shared (written from several shards) | shard (one shard's) | line (one line's)
    write: Fit
    read: Fit
    # units a second in one shard's busiest window beyond what its lines explain
    write_burst: float
    read_burst: float
    # a key of one line: the most units one key took in a run
    per_key: tuple[float, float]
    # (feature, base, slope) of the item's size, and the largest the runs saw (their units' size)
    size: tuple[str, float, float]
    local_size: float
    callers_write: tuple[tuple[str, Fit], ...]
    callers_read: tuple[tuple[str, Fit], ...]
    # the shards in flight in the run whose window gave each burst
    burst_at: tuple[int, int] = (0, 0)
    # the same past a shard's opening (its first second)
    later_burst: tuple[float, float] = (0.0, 0.0)

    def burst(self, metric: str, scenario: Scenario, *, later: bool = False) -> float:
        """One shard's busiest units a second beyond its lines (`later`: past its opening), at
        the scenario: as the runs saw it, or for reads the code paces by how many shards make them
        (`PACED_READS`), as it paces them at the scenario's shards in flight."""
        if metric == "write":
            return self.later_burst[0] if later else self.write_burst
        seen = self.later_burst[1] if later else self.read_burst
        wait = PACED_READS.get(self.shape)
        if wait is None or not self.burst_at[1]:
            return seen
        return seen * wait(self.burst_at[1]) / wait(scenario.running)

    def at_once(self, metric: str, scenario: Scenario) -> tuple[float, float]:
        """(a shard's busiest units a second, a later one's): what `_on_one_key` takes."""
        return self.burst(metric, scenario), self.burst(metric, scenario, later=True)


def _budget_wait(waiters: int) -> float:
    """The mean wait between a waiting shard's reads of the job row when `waiters` shards may wait
    (the job's shards in flight)."""
    return holders_poll_s(waiters, lambda: 0.5)


# Reads the code spaces out as more shards make them: the shards waiting for the others' budget
# pools read the job row (its META item) about HOLDERS_READS_PER_S times a second all together,
# however many wait (`sluice.budget.holders_poll_s`). A run has a few shards in flight; the model
# paces a shard's burst as the code does at the scenario's.
PACED_READS: dict[str, Callable[[int], float]] = {"JOB#{job} META": _budget_wait, "JOB#{job}": _budget_wait}


def _units(size: float, per: int) -> float:
    return max(1.0, math.ceil(size / per))


def _size_fit(runs: Sequence[Mapping[str, Any]], sizes: Sequence[float]) -> tuple[str, float, float]:
    """size = base + slope·feature, for the one feature (or none) that explains how it grew over
    the runs: the shards in flight, the shards, or a shard's lines (an item holds what is running,
    what a job has, or what a shard has). It must explain most of the change (R² of 0.8) and be
    growth of some substance: a counter's digits, a few bytes over the runs, are not."""
    largest = float(max(sizes, default=0))
    mean = sum(sizes) / max(1, len(sizes))
    spread = sum((s - mean) ** 2 for s in sizes)
    best, error = ("", largest, 0.0), spread
    for name in ("in_flight", "shards", "lines_per_shard"):
        fit = Fit.of_runs(runs, sizes, ("one", name))
        values = [_row(r["features"], (name,))[0] for r in runs]
        grown = fit.of(name) * (max(values) - min(values))
        residual = sum((s - fit(r["features"])) ** 2 for r, s in zip(runs, sizes, strict=True))
        explains = spread > 0 and residual <= 0.2 * spread
        if grown >= max(SIZE_GROWTH_BYTES, 0.1 * largest) and explains and residual < error:
            best, error = (name, fit.of("one"), fit.of(name)), residual
    return best


def _shard_callers(entry_by: Mapping[str, Mapping[str, float]]) -> dict[str, Mapping[str, float]]:
    return {k.split(" ", 1)[1]: v for k, v in entry_by.items() if k.split(" ", 1)[0] == SHARD_PHASE}


def one_run_a_window(run: Mapping[str, Any]) -> bool:
    """Whether a shard's busiest window in the run is one run's: its runs (the Lambda's timeout less
    the margin it keeps) last two windows or more, as on AWS. Runs made to loop every few seconds
    put the ends of two runs in one window, which no shard on AWS does."""
    cloud = run.get("cloud") or {}
    if not cloud:
        return True
    return float(cloud["lambda_timeout_s"]) - float(cloud["safety_margin_s"]) >= 2 * WINDOW_S


def near_the_keys_share(run: Mapping[str, Any]) -> bool:
    """Whether the run's shards each went near their share of the key at the maximum (half a line a
    second): a shard's leases, checkpoints and polls per second follow its pace, so a window of a
    shard that went many times faster (a run made for memory or the cache, the key far from
    binding) is no shard's at the maximum. Batch shards send no line through the key."""
    spec = run.get("spec") or {}
    if spec.get("mode") == "batch" or "key_rpm" not in spec:
        return True
    return spec["key_rpm"] / 60 / max(1, run["features"]["in_flight"]) <= SHARD_PACE_MAX


def key_classes(runs: Sequence[Mapping[str, Any]], shown: Sequence[Mapping[str, Any]]) -> list[KeyClass]:
    """The key classes that the shards (and webhooks) of `runs` touch, fitted; `shown` (the mode's
    runs, capped and failed ones too) give the busiest windows."""
    names = sorted({n for r in runs for n, res in r["resources"].items() if _shard_callers(res["by"])})
    out = []
    for name in names:
        kind, shape = name.split(" ", 1)
        mine = [r["resources"].get(name) or {"by": {}, "keys": 0, "spread": 0, "size": 0} for r in runs]
        callers = sorted({c for m in mine for c in _shard_callers(m["by"])})

        def total(metric: str, only: str | None = None, mine: list[Any] = mine) -> list[float]:
            return [
                sum(e.get(metric, 0.0) for c, e in _shard_callers(m["by"]).items() if only in (None, c)) for m in mine
            ]

        write, read = Fit.of_runs(runs, total("write"), FEATURES), Fit.of_runs(runs, total("read"), FEATURES)
        local_size = max(m["size"] for m in mine)
        bursts = {"write": 0.0, "read": 0.0}
        later = {"write": 0.0, "read": 0.0}
        burst_at = {"write": 0, "read": 0}
        for run in (r for r in shown if one_run_a_window(r) and near_the_keys_share(r)):
            resource = run["resources"].get(name) or {}
            for metric, fit in (("write", write), ("read", read)):
                for units, lines in resource.get("windows", {}).get(metric, []):
                    if (units - fit.of("lines") * lines) / WINDOW_S > bursts[metric]:
                        bursts[metric] = (units - fit.of("lines") * lines) / WINDOW_S
                        burst_at[metric] = int(run["features"]["in_flight"])
                # runs measured before openings were told apart: every window may be an opening's
                past = resource.get("later_windows", resource.get("windows", {}))
                for units, lines in past.get(metric, []):
                    later[metric] = max(later[metric], (units - fit.of("lines") * lines) / WINDOW_S)
        spread = max(m["spread"] for m in mine)
        many_keys = any(m["keys"] > 1.5 * max(1, r["features"]["shards"]) for m, r in zip(mine, runs, strict=True))
        scope = "shared" if spread >= 2 else "line" if many_keys or spread == 0 else "shard"
        writes, reads = total("write"), total("read")
        per_key = (
            max(w / max(1, m["keys"]) for w, m in zip(writes, mine, strict=True)),
            max(r / max(1, m["keys"]) for r, m in zip(reads, mine, strict=True)),
        )
        out.append(
            KeyClass(
                kind=kind,
                shape=shape,
                scope=scope,
                write=write,
                read=read,
                write_burst=bursts["write"],
                read_burst=bursts["read"],
                burst_at=(burst_at["write"], burst_at["read"]),
                later_burst=(later["write"], later["read"]),
                per_key=per_key,
                size=_size_fit(runs, [m["size"] for m in mine]) if kind == "ddb-item" else ("", 0.0, 0.0),
                local_size=local_size,
                callers_write=tuple((c, Fit.of_runs(runs, total("write", c), FEATURES)) for c in callers),
                callers_read=tuple((c, Fit.of_runs(runs, total("read", c), FEATURES)) for c in callers),
            )
        )
    return out


def _on_one_key(fit: Fit, bursts: tuple[float, float], scenario: Scenario, scope: str) -> float:
    """Units a second on one key of a class at its busiest while the shards run: `bursts` are a
    shard's busiest units a second beyond its lines, and its busiest past its opening. On a key
    every shard shares, the shards opening at once take the first, the others the second."""
    running = scenario.running
    beyond_lines = steady(fit, scenario) - fit.of("lines") * scenario.pace
    burst, later = bursts
    per_shard = max(beyond_lines / running, burst)
    if scope == "shared":
        opening = min(running, OPENINGS_PER_S * (WINDOW_S + OPENING_S))
        rest = (running - opening) * max(beyond_lines / running, later)
        return fit.of("lines") * scenario.pace + opening * per_shard + rest
    return fit.of("lines") * scenario.pace / running + per_shard


def item_size(key: KeyClass, scenario: Scenario) -> float:
    feature, base, slope = key.size
    return base + slope * (scenario.features()[feature] if feature else 0.0)


def _sized(key: KeyClass, scenario: Scenario, write: float, read: float) -> tuple[float, float]:
    """An item's units follow its size: each call's, per 1 KB written and 4 KB read."""
    if key.kind != "ddb-item":
        return write, read
    size = item_size(key, scenario)
    return write * _units(size, 1024) / _units(key.local_size, 1024), read * _units(size, 4096) / _units(
        key.local_size, 4096
    )


def on_partition(key: KeyClass, scenario: Scenario, partition: str = "shared") -> tuple[float, float]:
    """What the items of a class put on their partition key at its busiest, at their size. A
    partition key of the job (`partition` "shared") holds every key of the class: all the shards'
    own rows, every line's. A partition key of one shard ("shard") holds that shard's: its own row,
    and the rows of its lines, which come at one shard's pace; one of a line ("line"), that line's."""
    if partition == "shared":
        if key.scope == "line":
            write, read = steady(key.write, scenario), steady(key.read, scenario)
        else:
            write = _on_one_key(key.write, key.at_once("write", scenario), scenario, "shared")
            read = _on_one_key(key.read, key.at_once("read", scenario), scenario, "shared")
    elif partition == "line":
        write, read = key.per_key
    else:
        # a line's rows: what the lines of one shard do to them (they are all under its key), and
        # its busiest window beyond them; any other item: one key's, as the shard writes it
        write = _on_one_key(key.write, key.at_once("write", scenario), scenario, "shard")
        read = _on_one_key(key.read, key.at_once("read", scenario), scenario, "shard")
    return _sized(key, scenario, write, read)


def key_figures(key: KeyClass, scenario: Scenario) -> list[Figure]:
    mode = scenario.mode
    if key.scope == "line":
        write, read = key.per_key
    else:
        write = _on_one_key(key.write, key.at_once("write", scenario), scenario, key.scope)
        read = _on_one_key(key.read, key.at_once("read", scenario), scenario, key.scope)
    write, read = _sized(key, scenario, write, read)
    figures = []
    if key.kind == "ddb-item":
        size = item_size(key, scenario)
        figures.append(Figure(f"item {key.shape}: size", mode, size, DDB_ITEM_BYTES, "bytes"))
    if key.kind == "s3-prefix":
        figures.append(Figure(f"S3 prefix {key.shape}: PUT/s", mode, write, S3_PREFIX_PUT_PER_S, "PUT/s"))
        figures.append(Figure(f"S3 prefix {key.shape}: GET/s", mode, read, S3_PREFIX_GET_PER_S, "GET/s"))
        return figures
    label = {"ddb-item": "item", "ddb-partition": "partition key", "ddb-index": "index key"}[key.kind]
    for metric, value, limit, callers in (
        ("WCU/s", write, DDB_PARTITION_WCU_PER_S, key.callers_write),
        ("RCU/s", read, DDB_PARTITION_RCU_PER_S, key.callers_read),
    ):
        figures.append(
            Figure(f"{label} {key.shape}: {metric}", mode, value, limit, metric, _split(callers, scenario, value))
        )
    return figures


def _split(callers: Sequence[tuple[str, Fit]], scenario: Scenario, value: float) -> tuple[tuple[str, float], ...]:
    """`value` split among its callers as their steady rates split."""
    rates = {name: steady(fit, scenario) for name, fit in callers}
    whole = sum(rates.values())
    if not whole:
        return ()
    return tuple(sorted(((name, value * rate / whole) for name, rate in rates.items() if rate), key=lambda p: -p[1]))


# ---- the job's own steps


@dataclass(frozen=True)
class StepModel:
    step: str
    cpu: Fit
    memory: Fit | None
    calls: tuple[tuple[str, Fit], ...]  # "<service> <operation>" -> count
    bytes: Fit
    keys: tuple[tuple[str, Fit, Fit], ...]  # key class -> write, read units
    # the calls the step keeps in flight at once, as the runs saw it (1: one after the other)
    in_flight: float = 1.0
    # work the code bounds by time, set apart from the fits: its seconds at most
    slice_s: float = 0.0


# What a step after the shards is fitted against. Merge reads what the shards finished, whatever
# time they took, by mode; MarkFailed also assembles what they left unfinished, parts written as
# the shards ran (a part every few seconds of a shard, and one as each run ends).
AFTER_SHARDS = {
    "merge": ("one", "lines", "shards", "background_lines", "batch_lines", "background_shards", "batch_shards"),
    "mark_failed": ("one", "lines", "shards", "runs", "shard_seconds"),
    # one event, whatever the job's size: its CPU in a run is noise to fit against nothing else
    "notify": ("one",),
    "": ("one", "lines", "shards", "shard_seconds"),
}


# Steps whose bytes are the job's outputs, concatenated by Merge's part planner (`streamed_share`)
CONCATENATES = ("merge",)


# Work a step does within a time slice the code gives it, whatever the job: Merge's compaction of
# the response cache (`sluice.cache_compact.compact_slice`), on the cache's own prefix. Its calls
# follow the cache's backlog, not the job, so they are no part of Merge's fits; its time is the slice.
SLICES = {"merge": (f"s3-prefix {CACHE_PREFIX}", SLICE_S)}


def _in_flight(stats: Sequence[Mapping[str, Any]]) -> float:
    """Calls in flight at once while any is, in the run where the step made the most of them (the
    one nearest a job at scale): its calls' seconds over the seconds any was in flight."""
    busy = [s for s in stats if s.get("calls_busy")]
    if not busy:
        return 1.0
    largest = max(busy, key=lambda s: s["call_seconds"])
    return max(1.0, largest["call_seconds"] / largest["calls_busy"])


def step_model(runs: Sequence[Mapping[str, Any]], step: str) -> StepModel | None:
    """A job step's calls, units, CPU and memory, fitted over the runs it ran in. A step that runs
    before the shards (it started first in every run) is fitted against what it can know of: the
    lines, the shards and the cache; one after them, against the lines, shards and shard-seconds.
    Its calls within a slice of time (`SLICES`) are set apart: the slice bounds them."""
    runs = [r for r in runs if step in r["steps"]]
    if not runs:
        return None
    apart, slice_s = SLICES.get(step, ("", 0.0))
    before = all(r["steps"][step].get("before_shards") for r in runs)
    names = ("one", "lines", "shards", "cached") if before else AFTER_SHARDS.get(step, AFTER_SHARDS[""])
    prefix = f"{step} {step} "
    stats = [r["steps"][step] for r in runs]
    # its own CPU seconds, from the runs where tracing did not slow it
    plain = [(r, s) for r, s in zip(runs, stats, strict=True) if not s.get("traced")] or list(
        zip(runs, stats, strict=True)
    )
    cpu = Fit.of_runs([r for r, _ in plain], [s["cpu"] for _, s in plain], names)
    # memory as traced in a warm container, with a cold start's extra (clients, imports) on top. What
    # a step holds at once grows with what it reads at once: before the shards, the whole input and
    # cache; after them, one shard's outputs at a time (its calls go shard by shard), so a shard's lines
    held = ("one", "lines", "cached") if before else ("one", "lines_per_shard")
    warm = [(r, s["memory"]) for r, s in zip(runs, stats, strict=True) if s.get("memory") and not s.get("cold")]
    memory = None
    if warm:
        fitted = Fit.of_runs([r for r, _ in warm], [m for _, m in warm], held)
        cold = [
            s["memory"] - fitted(r["features"])
            for r, s in zip(runs, stats, strict=True)
            if s.get("memory") and s.get("cold")
        ]
        extra = max([0.0, *cold])
        memory = Fit(
            fitted.names,
            tuple(c + (extra if n == "one" else 0.0) for c, n in zip(fitted.coefficients, fitted.names, strict=True)),
        )
    labels = sorted({k for r in runs for k in r["calls"] if k.startswith(prefix)})

    def count(run: Mapping[str, Any], label: str) -> float:
        service, operation = label.removeprefix(prefix).split(" ", 1)
        inside = (run["resources"].get(apart) or {"by": {}})["by"] if apart and service == "s3" else {}
        return float(run["calls"].get(label, 0.0)) - inside.get(f"{step} {step} {operation}", {}).get("calls", 0.0)

    calls = tuple(
        (label.removeprefix(prefix), Fit.of_runs(runs, [count(r, label) for r in runs], names)) for label in labels
    )
    keys = []
    moved = [0.0] * len(runs)
    for name in sorted({n for r in runs for n in r["resources"]}):
        if apart and name.startswith(apart):
            continue
        writes, reads = [0.0] * len(runs), [0.0] * len(runs)
        for i, run in enumerate(runs):
            for caller, entry in (run["resources"].get(name) or {"by": {}})["by"].items():
                if caller.startswith(prefix):
                    writes[i] += entry.get("write", 0.0)
                    reads[i] += entry.get("read", 0.0)
                    # each call's bytes once: at the top level of the bucket's prefixes
                    if name.startswith("s3-prefix ") and name.count("/") == 1:
                        moved[i] += entry.get("bytes", 0.0)
        if any(writes) or any(reads):
            keys.append((name, Fit.of_runs(runs, writes, names), Fit.of_runs(runs, reads, names)))
    return StepModel(step, cpu, memory, calls, Fit.of_runs(runs, moved, names), tuple(keys), _in_flight(stats), slice_s)


def shard_memory(runs: Sequence[Mapping[str, Any]], step: str) -> Fit | None:
    """A provider step's memory against the requests a shard keeps in flight, from the runs where it
    ran alone in the process (traced), warm."""
    traced = [(r, r["steps"][step]) for r in runs if step in r["steps"] and r["steps"][step].get("memory")]
    warm = [(r, s["memory"]) for r, s in traced if not s.get("cold")] or [(r, s["memory"]) for r, s in traced]
    if not warm:
        return None
    rows = [{"features": {"per_shard": r["spec"]["per_shard"]}} for r, _ in warm]
    return Fit.of_runs(rows, [m for _, m in warm], ("one", "per_shard"))


def call_seconds(model: StepModel, features: Mapping[str, float], only: str = "") -> float:
    """The step's calls (those whose label starts with `only`) at AWS's latency, as many at once
    as the runs saw it keep in flight."""
    waiting = sum(
        fit(features) * CALL_LATENCY_S.get(label.split(" ", 1)[0], OTHER_CALL_LATENCY_S)
        for label, fit in model.calls
        if label.startswith(only)
    )
    return waiting / model.in_flight


def streamed_share(model: StepModel, features: Mapping[str, float]) -> float:
    """The share of the outputs' bytes that pass through Merge (and MarkFailed's merge) at the
    features' shard size: Merge's part planner copies a shard of 5 MB or more server-side, so only
    the seams of a shard that large are read and sent again. The runs' shards are small, so every
    byte of theirs passed through: the fit counts each twice (read, then sent), at a line's size."""
    lines, shards = features.get("lines", 0.0), features.get("shards", 0.0)
    if not lines or not shards:
        return 1.0
    line = model.bytes.of("lines") + sum(model.bytes.of(f"{m}_lines") for m in MODES if features.get(f"{m}_lines"))
    size = int(lines / shards * line / 2)
    parts = plan_parts([size] * int(shards))
    whole = sum(part.size for part in parts)
    return sum(part.size for part in parts if not part.copy) / whole if whole else 1.0


def step_seconds(model: StepModel, features: Mapping[str, float]) -> float:
    """The step's time on AWS: its own CPU, its calls (`call_seconds`), the bytes that pass through
    it at one stream's pace, and the slice it gives bounded work."""
    moved = model.bytes(features) * (streamed_share(model, features) if model.step in CONCATENATES else 1.0)
    return model.cpu(features) + moved / STREAM_BYTES_PER_S + call_seconds(model, features) + model.slice_s


def step_figures(
    model: StepModel, scenario: Scenario, features: Mapping[str, float] | None = None, seconds: float | None = None
) -> list[Figure]:
    """The step's duration, memory and rates on keys at the scenario; with `seconds`, the rates over
    that long (a step that runs in several invocations), and no duration (the caller has it)."""
    features = scenario.features() if features is None else features
    step, mode = STEPS[model.step], scenario.mode
    figures = []
    if seconds is None:
        seconds = step_seconds(model, features)
        figures.append(Figure(f"{model.step}: duration", mode, seconds, step.timeout_s, "s"))
    if model.memory is not None:
        held = (model.memory(features)) / 2**20
        figures.append(Figure(f"{model.step}: memory", mode, held, step.memory_mb, "MB"))
    for name, write, read in model.keys:
        kind, shape = name.split(" ", 1)
        w, r = write(features) / max(seconds, 1.0), read(features) / max(seconds, 1.0)
        if kind == "ddb-partition":
            figures.append(
                Figure(f"partition key {shape}: WCU/s from {model.step}", mode, w, DDB_PARTITION_WCU_PER_S, "WCU/s")
            )
            figures.append(
                Figure(f"partition key {shape}: RCU/s from {model.step}", mode, r, DDB_PARTITION_RCU_PER_S, "RCU/s")
            )
        elif kind == "s3-prefix":
            figures.append(Figure(f"S3 prefix {shape}: PUT/s from {model.step}", mode, w, S3_PREFIX_PUT_PER_S, "PUT/s"))
            figures.append(Figure(f"S3 prefix {shape}: GET/s from {model.step}", mode, r, S3_PREFIX_GET_PER_S, "GET/s"))
    return figures


# ---- Lambda concurrency and Step Functions' APIs


def _count(runs: Sequence[Mapping[str, Any]], match: Callable[[str], bool]) -> Fit:
    return Fit.of_runs(runs, [sum(v for k, v in r["calls"].items() if match(k)) for r in runs], FEATURES)


def concurrency_figures(
    runs: Sequence[Mapping[str, Any]], scenario: Scenario, reserved: Mapping[str, int], account: int
) -> list[Figure]:
    """Functions running at once: a Lambda per shard in flight, the webhooks at their rate times
    their time on AWS, and the job's own step; against the account's pool and each function's reservation."""
    mode = scenario.mode
    invocations = Fit.of_runs(runs, [r["steps"].get("webhook", {}).get("invocations", 0) for r in runs], FEATURES)
    calls = _count(runs, lambda k: k.startswith(f"{SHARD_PHASE} webhook "))
    per_call = CALL_LATENCY_S["dynamodb"]
    webhooks = steady(calls, scenario) * per_call + steady(invocations, scenario) * 0.005
    # a Lambda for each shard in flight while it runs (a batch shard's mostly waits, with none)
    shards = min(float(scenario.running), scenario.shard_seconds / scenario.wall)
    parts = (("shards in flight", shards), ("webhooks", webhooks), ("the job's own step", 1.0))
    total = shards + webhooks + 1.0
    # the account's quota is sized to the cap on shards in flight (`max_shards_in_flight`, which binds
    # by design) beside the webhook's reservation: a step past it is throttled and retried by the
    # workflow (THROTTLE_RETRY), and fails nothing
    figures = [Figure("Lambda concurrency (account)", mode, total, account, "at once", parts, cap=True)]
    # the step a shard starts in: every shard in flight may be in it at once
    step = SHARD_STEP[mode]
    if reserved.get(step):
        # the cap on shards in flight (`max_shards_in_flight`): it binds by design, shards past it
        # wait for a place (each refused start retried, THROTTLE_RETRY in the definition)
        figures.append(
            Figure(f"Lambda concurrency ({step}, reserved)", mode, shards, reserved[step], "at once", cap=True)
        )
    if reserved.get("webhook"):
        figures.append(Figure("Lambda concurrency (webhook, reserved)", mode, webhooks, reserved["webhook"], "at once"))
    return figures


def api_figures(runs: Sequence[Mapping[str, Any]], scenario: Scenario) -> list[Figure]:
    figures = []
    for operation, limit in SFN_API_PER_S.items():
        fit = _count(runs, lambda k, op=operation: k.endswith(f" sfn {op}"))  # type: ignore[misc]
        # StartExecution: one a job, from the EventBridge rule; jobs this size start no faster than they end
        rate = fit(scenario.features()) / scenario.wall if operation == "StartExecution" else steady(fit, scenario)
        if rate:
            figures.append(Figure(f"Step Functions {operation}", scenario.mode, rate, limit, "calls/s"))
    return figures


@dataclass
class Model:
    """The fits of every mode and step, from the measured runs."""

    runs: list[dict[str, Any]]
    stack: dict[str, Any] = field(default_factory=dict)
    keys: dict[str, list[KeyClass]] = field(default_factory=dict)
    steps: dict[str, StepModel] = field(default_factory=dict)
    shard_memory: dict[str, Fit] = field(default_factory=dict)
    # batch mode: a shard invocation's seconds, measured
    batch_run_s: float = 0.0

    @classmethod
    def of(cls, measured: Mapping[str, Any]) -> Model:
        runs = [
            {
                **r,
                "features": {
                    **r["features"],
                    **by_mode(r["spec"]["mode"], r["features"]["lines"], r["features"]["shards"]),
                },
            }
            for r in measured["runs"]
        ]
        model = cls(runs, dict(measured.get("stack", {})))
        for mode in MODES:
            fitted = [r for r in runs if r["spec"]["mode"] == mode and r["spec"]["fit"]]
            shown = [r for r in runs if r["spec"]["mode"] == mode]
            if fitted:
                model.keys[mode] = key_classes(fitted, shown)
        for step in JOB_STEPS:
            found = step_model(runs, step)
            if found is not None:
                model.steps[step] = found
        batch = [r for r in runs if r["spec"]["mode"] == "batch"]
        if batch:
            model.batch_run_s = sum(r["features"]["shard_seconds"] for r in batch) / sum(
                r["features"]["runs"] for r in batch
            )
        for step in PROVIDER_STEPS:
            memory = shard_memory(runs, step)
            if memory is not None:
                model.shard_memory[step] = memory
        return model

    def fitted(self, mode: str) -> list[dict[str, Any]]:
        return [r for r in self.runs if r["spec"]["mode"] == mode and r["spec"]["fit"]]
