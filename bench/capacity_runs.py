"""The measured runs behind bench/capacity.py: small local jobs, and what the ledger saw of each.

Each run is a real job in the local cloud (the same state machine and Lambda code, IAM and
quotas enforced) against the simulator, whose key is held to a per-key limit as a provider's
is: every shard leases from the shared limit and runs at its share, as shards do when a key
is the bottleneck. The runs vary the lines, the shards, the shards in flight, how long shards
run and how often they loop, and the mode, so that a fit can tell what a line costs from what a
shard, a run and a second of a shard cost (`capacity_model`). Two more kinds of run show what
only happens sometimes: a job whose spending cap runs out (the end-of-job wait for the others'
refunds) and jobs that fail (MarkFailed). The response cache stays on and grows from run to run,
so Plan meets caches of different sizes.

What is kept of a run (`summarize`) is an aggregate, never a constant typed by hand: per
DynamoDB partition key, item and index key, and per S3 prefix, with their keys' shapes (the
job's id and every run of digits replaced, so `JOB#<job>` and `SHARD#<n>` come out as the code
writes them today, and whatever it writes tomorrow): who called, how often, how many units and
bytes, from how many shards, and the busiest windows of a single shard.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sluice.budget import worst_case_nano
from sluice.contract import PROVIDER_STEPS
from sluice.lines import parse_line
from sluice.model import Request
from sluice.providers import OPENAI

from local.cloud import LocalCloud, LocalSettings, run_job
from local.ledger import CLOUD, Call, CallLedger
from local.simulator import SimConfig, SimulatorServer

# a shard's busiest stretch is measured over windows this long, sliding by a second: long enough
# to hold one period of the slowest per-shard loop the code runs (a read every few seconds)
WINDOW_S = 5.0
# a shard's opening: its calls within this long of its first, which the first wave spreads out
# (`sluice.shard.opening_delay_s`); its later windows leave them out
OPENING_S = 1.0
# the input's key: a real upload's length, since the job id (and every key holding it) derives from it
INPUT_KEY = "inbox/team/product-reviews-2026-11-{name}.jsonl"
API_KEY = "sk-capacity"
# callers that are not a shard's and not a step of the job's own (Plan, Merge, ...)
SHARD_PHASE_CALLERS = frozenset({"webhook"})


@dataclass(frozen=True)
class RunSpec:
    """One measured job. `cloud` groups the runs that share a local cloud (and its cache)."""

    name: str
    cloud: str
    mode: str = "direct"
    lines: int = 120
    in_flight: int = 4
    per_shard: int = 8
    key_rpm: int = 2400
    latency_s: float = 0.05
    # "ample": a cap the job never reaches; "short": half the job's worst case; None: no cap
    budget: str | None = "ample"
    # the job fails from this provider-step invocation on (MarkFailed runs)
    fail_from: int | None = None
    # the run's totals join the fit (a failing or capped run shows a phase, not the steady state)
    fit: bool = True
    # trace its steps' memory (tracemalloc slows them: their CPU seconds are then not theirs)
    trace: bool = False


@dataclass(frozen=True)
class CloudSpec:
    shard_lines: int
    lambda_timeout_s: float = 900.0
    safety_margin_s: float = 20.0
    request_timeout_s: float = 10.0


CLOUDS = {
    "a": CloudSpec(shard_lines=30),
    "b": CloudSpec(shard_lines=120),
    # shards loop: each run has a few seconds before it drains and checkpoints
    "loop": CloudSpec(shard_lines=30, lambda_timeout_s=6.0, safety_margin_s=1.0, request_timeout_s=2.0),
    # the same with three times the lines a shard: what MarkFailed does per shard and per line differ
    "loop-wide": CloudSpec(shard_lines=90, lambda_timeout_s=6.0, safety_margin_s=1.0, request_timeout_s=2.0),
}

# The fitted runs keep each shard near a line a second, the key's share of a shard at the
# documented maximum (30,000 RPM over 1,000 shards is half a line a second): a shard's checkpoints,
# leases and polls then come at the pace they come at scale, so what is fitted per line and what
# per shard-second need not be told apart by the fit alone. `key_rpm` is the key's limit.
RUNS = (
    RunSpec("direct", "a", lines=60, in_flight=2, key_rpm=120),
    RunSpec("direct-shards", "a", lines=240, in_flight=8, key_rpm=480),
    RunSpec("direct-slow", "a", lines=120, in_flight=4, key_rpm=120),
    # the cap runs out while most shards still hold a pool of it: the others wait for their refunds
    RunSpec("direct-capped", "a", lines=240, in_flight=8, key_rpm=480, budget="short", fit=False),
    RunSpec("background", "a", mode="background", lines=60, in_flight=2, key_rpm=120),
    RunSpec("background-shards", "a", mode="background", lines=240, in_flight=8, key_rpm=480),
    RunSpec("background-slow", "a", mode="background", lines=120, in_flight=4, key_rpm=120),
    RunSpec("batch", "a", mode="batch"),
    RunSpec("batch-shards", "a", mode="batch", lines=480, in_flight=8),
    RunSpec("direct-lines", "b", lines=240, in_flight=2, key_rpm=240, trace=True),
    # one shard, alone in the process: its memory is traced
    RunSpec("direct-alone", "b", lines=120, in_flight=1, key_rpm=120, trace=True),
    RunSpec("background-lines", "b", mode="background", lines=240, in_flight=2, key_rpm=240),
    RunSpec("batch-lines", "b", mode="batch", lines=480, trace=True),
    # the key far from binding: a wide shard's memory, then a large cache for Plan to read
    RunSpec("direct-alone-wide", "b", in_flight=1, per_shard=64, key_rpm=60_000, fit=False, trace=True),
    RunSpec("direct-cache", "b", lines=8000, per_shard=100, key_rpm=120_000, budget=None, fit=False, trace=True),
    RunSpec("direct-after-cache", "b", budget=None, fit=False, trace=True),
    RunSpec("direct-loops", "loop", lines=120, in_flight=4, key_rpm=240),
    # every run after the first wave fails: the first wave's parts are left for MarkFailed
    RunSpec("direct-failed", "loop", lines=240, key_rpm=480, fail_from=5, fit=False),
    RunSpec("direct-failed-long", "loop", lines=480, in_flight=8, key_rpm=960, fail_from=9, fit=False, trace=True),
    RunSpec("direct-failed-wide", "loop-wide", lines=360, in_flight=4, key_rpm=480, fail_from=9, fit=False),
    # fewer shards of the same width: what MarkFailed does once a job from what it does per shard
    RunSpec("direct-failed-few", "loop-wide", lines=180, in_flight=2, key_rpm=240, fail_from=5, fit=False),
    # the same at half a line a second a shard, as at the maximum: parts come with a shard's seconds
    RunSpec("direct-failed-slow", "loop-wide", lines=180, in_flight=2, key_rpm=120, fail_from=5, fit=False),
)


def request_line(run: str, n: int, mode: str) -> bytes:
    """A request of its own (the cache never answers it), of a typical chat or Responses size."""
    text = f"Run {run}, line {n}: summarise this product review in one sentence. " + "The kettle boils fast. " * 8
    if mode == "background":
        body: dict[str, Any] = {"model": "gpt-4o-mini", "input": text, "max_output_tokens": 64}
        url = "/v1/responses"
    else:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], "max_tokens": 64}
        url = "/v1/chat/completions"
    return orjson.dumps({"custom_id": f"{run}-{n:06d}", "method": "POST", "url": url, "body": body}) + b"\n"


def shape(text: str, job_id: str) -> str:
    """A key as the code writes it for any job: the job's id as `{job}`, every word with a digit as `{n}`."""
    if job_id:
        text = text.replace(job_id, "{job}")
    return re.sub(r"[A-Za-z0-9]*\d[A-Za-z0-9]*", "{n}", text)


def prefixes(key: str) -> list[str]:
    """Every prefix of an S3 key that ends at a `/`: the levels S3 may partition a bucket's keys at."""
    return [key[: i + 1] for i, c in enumerate(key) if c == "/"]


# ---- what a run's ledger says


def _phase(call_step: str, shard: int | None) -> str:
    """`shard` for what shards (and webhooks, per line) do while the job runs; else the job step's name."""
    return "shard" if shard is not None or call_step in SHARD_PHASE_CALLERS else call_step


@dataclass
class _Resource:
    keys: set[str] = field(default_factory=set)
    shards: dict[str, set[tuple[str | None, int]]] = field(default_factory=lambda: defaultdict(set))
    size: int = 0
    by: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    # per (execution, shard): second -> (write, read) units; `later`: past the shard's opening
    series: dict[tuple[str | None, int], dict[int, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    )
    later: dict[tuple[str | None, int], dict[int, list[float]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    )

    def add(
        self, key: str, call: Call, phase: str, write: float, read: float, *, kind: str, opened: float = math.inf
    ) -> None:
        """`opened`: when the calling shard made its first call of the run."""
        self.keys.add(key)
        if call.shard is not None:
            self.shards[key].add((call.execution, call.shard))
            slot = self.series[(call.execution, call.shard)][int(call.at)]
            slot[0] += write
            slot[1] += read
            if call.at - opened >= OPENING_S:
                past = self.later[(call.execution, call.shard)][int(call.at)]
                past[0] += write
                past[1] += read
        entry = self.by[f"{phase} {call.step} {call.operation}"]
        entry["calls"] += 1
        entry["write"] += write
        entry["read"] += read
        entry[kind] += 1
        entry["bytes"] += call.nbytes or call.item_bytes
        if not call.nbytes:
            self.size = max(self.size, call.item_bytes)

    def summary(self, lines: dict[tuple[str | None, int], dict[int, int]]) -> dict[str, Any]:
        return {
            "keys": len(self.keys),
            "spread": max((len(s) for s in self.shards.values()), default=0),
            "size": self.size,
            "by": {name: dict(entry) for name, entry in sorted(self.by.items())},
            "windows": _busiest(self.series, lines),
            "later_windows": _busiest(self.later, lines),
        }


def _busiest(
    series: dict[tuple[str | None, int], dict[int, list[float]]],
    lines: dict[tuple[str | None, int], dict[int, int]],
) -> dict[str, list[list[float]]]:
    """Per metric, a shard's (units, lines) in each window of WINDOW_S, kept where no other window
    has as many units with fewer lines: whatever a line costs, the busiest window is among them."""
    width = int(WINDOW_S)
    found: dict[str, set[tuple[float, int]]] = {"write": set(), "read": set()}
    for shard, slots in series.items():
        ended = lines.get(shard, {})
        for start in range(min(slots) - width + 1, max(slots) + 1):
            span = range(start, start + width)
            done = sum(ended.get(s, 0) for s in span)
            for index, metric in enumerate(("write", "read")):
                units = sum(slots[s][index] for s in span if s in slots)
                if units:
                    found[metric].add((units, done))
    kept: dict[str, list[list[float]]] = {}
    for metric, points in found.items():
        best: list[list[float]] = []
        for units, done in sorted(points, key=lambda p: (p[1], -p[0])):
            if not best or units > best[-1][0]:
                best.append([units, done])
        kept[metric] = best
    return kept


def summarize(
    ledger: CallLedger,
    since: tuple[int, int, int],
    job_id: str,
    execution: str,
    *,
    warm: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The aggregates of one run: the ledger's records from `since` (calls, invocations, lines).
    `warm`: the steps that had run in this cloud before (their containers are warm)."""
    calls = [c for c in ledger.calls[since[0] :] if c.execution in (None, execution)]
    invocations = [i for i in ledger.invocations[since[1] :] if i.execution in (None, execution)]
    ended: dict[tuple[str | None, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for line in ledger.lines[since[2] :]:
        if line.shard is not None and line.execution == execution:
            ended[(line.execution, line.shard)][int(line.at)] += 1
    resources: dict[str, _Resource] = defaultdict(_Resource)
    services: dict[str, float] = defaultdict(float)
    opened: dict[tuple[str | None, int], float] = {}
    for call in calls:
        if call.shard is not None:
            opened[(call.execution, call.shard)] = min(opened.get((call.execution, call.shard), math.inf), call.at)
    for call in calls:
        if call.step == CLOUD and call.operation != "StartExecution":
            continue
        phase = _phase(call.step, call.shard)
        first = opened.get((call.execution, call.shard), math.inf) if call.shard is not None else math.inf
        if not call.more:
            services[f"{phase} {call.step} {call.service} {call.operation}"] += 1
        if call.service == "dynamodb":
            kind = "writes" if call.write_units else "reads_strong" if call.read_units >= 1 else "reads_eventual"
            if call.index:
                resources[f"ddb-index {call.index} {shape(call.pk, job_id)}"].add(
                    call.pk, call, phase, call.write_units, call.read_units, kind=kind, opened=first
                )
                continue
            pk = shape(call.pk, job_id)
            resources[f"ddb-partition {pk}"].add(
                call.pk, call, phase, call.write_units, call.read_units, kind=kind, opened=first
            )
            if call.sk or call.operation not in ("Query", "Scan"):
                item = f"ddb-item {pk} {shape(call.sk, job_id)}"
                resources[item].add(
                    f"{call.pk} {call.sk}", call, phase, call.write_units, call.read_units, kind=kind, opened=first
                )
        elif call.service == "s3":
            write, read = (1.0, 0.0) if call.s3_write else (0.0, 1.0)
            kind = "puts" if call.s3_write else "gets"
            for prefix in prefixes(call.key):
                resources[f"s3-prefix {shape(prefix, job_id)}"].add(
                    prefix, call, phase, write, read, kind=kind, opened=first
                )
    provider = [i for i in invocations if i.step in PROVIDER_STEPS]
    first_shard = min((i.at for i in provider), default=math.inf)
    steps: dict[str, dict[str, Any]] = {}
    for step in sorted({i.step for i in invocations}):
        mine = [i for i in invocations if i.step == step]
        memory = [i.memory_bytes for i in mine if i.memory_bytes is not None]
        others = [o for o in invocations if o.step != step]
        steps[step] = {
            "invocations": len(mine),
            "seconds": sum(i.seconds for i in mine),
            "max_seconds": max(i.seconds for i in mine),
            "call_seconds": sum(c.seconds for c in calls if c.step == step),
            # the seconds in which at least one of its calls was in flight: with call_seconds, how
            # many it keeps in flight at once (its pools), whatever each call took locally
            "calls_busy": _busy([c for c in calls if c.step == step and not c.more]),
            # CPU seconds on the handler's thread, less those moto spent there answering its calls
            "cpu": max(0.0, sum(i.cpu for i in mine) - sum(c.cpu for c in calls if c.step == step)),
            "traced": bool(memory),
            "memory": max(memory) if memory else None,
            "cold": step not in warm,
            "before_shards": all(i.at < first_shard for i in mine),
            # no other function ran meanwhile: its CPU seconds are its own
            "alone": not any(_overlap(i, o) for i in mine for o in others),
            "errors": sum(1 for i in mine if i.error),
        }
    return {
        "features": {
            "lines": 0,
            "shards": len({i.shard for i in provider}),
            "runs": len(provider),
            "shard_seconds": round(sum(i.seconds for i in provider), 3),
            "in_flight": _most_at_once(provider),
        },
        "resources": {name: r.summary(ended) for name, r in sorted(resources.items())},
        "calls": dict(sorted(services.items())),
        "steps": steps,
    }


def _busy(calls: list[Call]) -> float:
    """The length of the union of the calls' intervals."""
    busy, end = 0.0, -math.inf
    for call in sorted(calls, key=lambda c: c.at):
        start, stop = max(call.at, end), call.at + call.seconds
        if stop > start:
            busy += stop - start
            end = stop
    return round(busy, 6)


def _overlap(a: Any, b: Any) -> bool:
    return a.at < b.at + b.seconds and b.at < a.at + a.seconds


def _most_at_once(invocations: list[Any]) -> int:
    """The most provider-step invocations running at the same moment (shards in flight)."""
    edges = sorted([(i.at, 1) for i in invocations] + [(i.at + i.seconds, -1) for i in invocations])
    running = most = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


# ---- running them


@contextmanager
def _cloud(spec: CloudSpec, sim: SimulatorServer, *, trace_memory: bool) -> Iterator[LocalCloud]:
    settings = LocalSettings(
        shard_lines=spec.shard_lines,
        map_concurrency=8,
        concurrency=64,
        lambda_timeout_s=spec.lambda_timeout_s,
        safety_margin_s=spec.safety_margin_s,
        request_timeout_s=spec.request_timeout_s,
        retry_base_delay_s=0.05,
        # a shard's collect runs no closer than a window, as on AWS (every shipped environment waits
        # 10 s and more): at 1 s, a window would hold several, which no shard on AWS makes
        poll_seconds=int(WINDOW_S),
    )
    cloud = LocalCloud(provider_base_url=sim.base_url, api_key=API_KEY, settings=settings)
    cloud.calls.trace_memory = trace_memory
    with cloud.running():
        sim.configure(webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret)
        yield cloud


def _worst_case(rows: list[bytes]) -> float:
    total = 0
    for number, raw in enumerate(rows, start=1):
        parsed = parse_line(raw, number)
        assert isinstance(parsed, Request)
        total += worst_case_nano(parsed, OPENAI)
    return total / 1e9


def measure_one(
    cloud: LocalCloud, spec: RunSpec, sim: SimulatorServer, workdir: Path, cached: int, *, trace_memory: bool = True
) -> dict[str, Any]:
    rows = [request_line(spec.name, n, spec.mode) for n in range(spec.lines)]
    path = workdir / f"{spec.name}.jsonl"
    path.write_bytes(b"".join(rows))
    metadata = {
        "sluice-mode": spec.mode,
        "sluice-map-concurrency": str(spec.in_flight),
        "sluice-concurrency": str(spec.per_shard * spec.in_flight),
    }
    if spec.budget == "ample":
        metadata["sluice-budget-usd"] = f"{_worst_case(rows) * 10:.6f}"
    elif spec.budget == "short":
        # answers cost a small part of their worst case: a sixteenth of it runs out early on
        metadata["sluice-budget-usd"] = f"{_worst_case(rows) / 16:.6f}"
    sim.configure(latency_s=spec.latency_s, quota_rpm=spec.key_rpm, batch_phase_s=0.2)
    # the key as at scale, in use for longer than a minute: no minute's quota to spend at once, so
    # a small run's shards go at their share of the key's rate, as a large job's do
    sim.call(lambda s: s.limiter.drain(s.config, API_KEY))
    provider_calls = 0

    def failing(step: str, payload: dict[str, Any]) -> None:
        nonlocal provider_calls
        if step in PROVIDER_STEPS:
            provider_calls += 1
            if spec.fail_from is not None and provider_calls >= spec.fail_from:
                raise RuntimeError("capacity bench: this run fails its job")

    cloud.before_invoke = failing
    cloud.calls.trace_memory = trace_memory and spec.trace
    since = (len(cloud.calls.calls), len(cloud.calls.invocations), len(cloud.calls.lines))
    started = time.monotonic()
    run = run_job(cloud, path, key=INPUT_KEY.format(name=spec.name), metadata=metadata)
    wall = time.monotonic() - started
    _settle(cloud.calls)
    cloud.before_invoke = None
    execution = str(run.execution["executionArn"])
    warm = frozenset(i.step for i in cloud.calls.invocations[: since[1]])
    summary = summarize(cloud.calls, since, run.job_id, execution, warm=warm)
    summary["features"].update(lines=spec.lines, cached=cached, wall=round(wall, 3))
    summary["spec"] = asdict(spec)
    summary["cloud"] = asdict(CLOUDS[spec.cloud])
    summary["status"] = run.status
    summary["job_status"] = run.summary.get("status")
    summary["answered"] = len(run.results)
    summary["history_events"] = max((n for (_, i), n in cloud.quotas.history.items() if i is not None), default=0)
    cloud.quotas.history.clear()
    return summary


def _settle(ledger: CallLedger, *, quiet_s: float = 2.0, most_s: float = 120.0) -> None:
    """Wait until no call has come for `quiet_s`: the last webhooks of a run (the receiver answers
    them one by one, at moto's pace) and checkpoints land after its execution ends, and would
    count as the next run's."""
    deadline = time.monotonic() + most_s
    seen = -1
    while time.monotonic() < deadline:
        count = len(ledger.calls) + len(ledger.invocations)
        if count == seen:
            return
        seen = count
        time.sleep(quiet_s)


def measure(runs: tuple[RunSpec, ...] = RUNS, *, log: Any = None, trace_memory: bool = True) -> list[dict[str, Any]]:
    """Every run, cloud by cloud (each cloud's cache growing from run to run), in RUNS' order."""
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp, SimulatorServer(SimConfig(seed=7)) as sim:
        for name, cloud_spec in CLOUDS.items():
            mine = [r for r in runs if r.cloud == name]
            if not mine:
                continue
            cached = 0
            with _cloud(cloud_spec, sim, trace_memory=trace_memory) as cloud:
                for spec in mine:
                    summary = measure_one(cloud, spec, sim, Path(tmp), cached, trace_memory=trace_memory)
                    cached += summary["answered"]
                    measured[spec.name] = summary
                    if log is not None:
                        log(f"{spec.name}: {summary['job_status']} in {summary['features']['wall']:.1f} s")
    return [measured[r.name] for r in runs if r.name in measured]


def reserved_concurrency(template: dict[str, Any]) -> dict[str, int]:
    """Each step's reserved concurrency, where the stack sets one."""
    reserved: dict[str, int] = {}
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        handler = str(props.get("Handler", ""))
        limit = props.get("ReservedConcurrentExecutions")
        if resource["Type"] == "AWS::Lambda::Function" and handler.startswith("handlers.") and limit is not None:
            reserved[handler.split(".")[1]] = int(limit)
    return reserved


def stack_figures(env: str = "prod") -> dict[str, Any]:
    """What the synthesized stack sets that the model needs: each function's reserved concurrency."""
    from local.iam import synthesized_template

    return {"env": env, "reserved_concurrency": reserved_concurrency(synthesized_template(env))}
