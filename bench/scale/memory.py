"""Plan, Merge and MarkFailed memory as the process's peak resident size, and their CPU, by job size.

    .venv/bin/python bench/scale/memory.py measure --out bench/scale/memory.json
    .venv/bin/python bench/scale/memory.py show

Each point is one run of the step in a fresh process (`--child`), which prints one JSON line:
its peak resident size (VmHWM, what Lambda's memory limit counts; not tracemalloc, which misses
what C extensions and the allocator hold) and the CPU seconds the step took. Plan runs with an
empty response cache and with a big one (`bench/cachescale.py` builds and keeps it under
out/bench/); Merge and MarkFailed run against a moto server in a process of its own, so the
objects it holds are not the step's memory.

`fit` draws a least-squares line of peak MB (and of CPU seconds) on lines through a step's
points; its upper bound at a size is the line plus 3 standard errors of the prediction there,
and never below the largest point measured. `show` holds the bound at 10^7 lines to half the
step's memory_mb and to its timeout_s (contract.STEPS), from the recorded JSON alone.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

from bench import cachescale  # noqa: E402
from bench.plan import moto_server  # noqa: E402

WORK = cachescale.WORK
RECORD = ROOT / "bench" / "scale" / "memory.json"
STEPS = ("plan", "merge", "mark_failed")
SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
TARGET_LINES = 10_000_000
# 10^8 answers build in about 90 s on this machine
CACHE_ANSWERS = 100_000_000
# the big cache is built for a job of this many lines, a tenth of them answered; smaller jobs
# are its first lines, so one index serves every size
CACHE_JOB_LINES = 1_000_000
CACHE_HITS = 0.1
SHARD_LINES = 5_000
# a checkpoint part every 37 rows is what a shard at 12.5 requests/s writes; the fixture writes
# coarser parts so that 10^6 lines build in minutes on moto, and MarkFailed's memory holds one
# shard's parts at a time whatever their size
PART_ROWS = 500
# the moto server Merge and MarkFailed run beside holds a job of 10^7 lines in files
# (bench/scale/big_objects.py): objects over a megabyte are never held in its memory
MOTO_PATCHES = "bench.scale.big_objects"
MOTO_ENV = {"MOTO_S3_DEFAULT_KEY_BUFFER_SIZE": str(1 << 20)}
# Plan's child holds this many bytes a line while it plans: how the tests plant a per-line
# allocation in a real run
PLANT_ENV = "SLUICE_BENCH_PLANT_BYTES"


@dataclasses.dataclass(frozen=True)
class Measure:
    step: str
    lines: int
    # answers in the response cache (0: empty)
    cache: int
    peak_mb: float
    cpu_s: float
    baseline_mb: float = 0.0
    wall_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Fit:
    step: str
    cache: int
    slope_mb_per_line: float
    intercept: float
    cpu_slope: float
    cpu_intercept: float
    points: tuple[Measure, ...]

    def upper_mb_at(self, lines: int) -> float:
        return _upper([(m.lines, m.peak_mb) for m in self.points], self.slope_mb_per_line, self.intercept, lines)

    def upper_cpu_at(self, lines: int) -> float:
        return _upper([(m.lines, m.cpu_s) for m in self.points], self.cpu_slope, self.cpu_intercept, lines)


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    n = len(points)
    xbar = sum(x for x, _ in points) / n
    ybar = sum(y for _, y in points) / n
    sxx = sum((x - xbar) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0, ybar
    slope = sum((x - xbar) * (y - ybar) for x, y in points) / sxx
    return slope, ybar - slope * xbar


def _upper(points: Sequence[tuple[float, float]], slope: float, intercept: float, at: float) -> float:
    n = len(points)
    predicted = slope * at + intercept
    highest = max(y for _, y in points)
    if n < 3:
        # no degree of freedom left for an error estimate: the line itself
        return max(predicted, highest)
    xbar = sum(x for x, _ in points) / n
    sxx = sum((x - xbar) ** 2 for x, _ in points)
    residual = sum((y - slope * x - intercept) ** 2 for x, y in points)
    sigma = math.sqrt(residual / (n - 2))
    spread = sigma * math.sqrt(1 + 1 / n + ((at - xbar) ** 2 / sxx if sxx else 0.0))
    return max(predicted + 3 * spread, highest)


def fit(measures: Iterable[Measure]) -> list[Fit]:
    """One fit for each step and cache, over its measured sizes."""
    groups: dict[tuple[str, int], list[Measure]] = {}
    for m in measures:
        groups.setdefault((m.step, m.cache), []).append(m)
    fits = []
    for (step, cache), points in groups.items():
        points.sort(key=lambda m: m.lines)
        slope, intercept = _line([(m.lines, m.peak_mb) for m in points])
        cpu_slope, cpu_intercept = _line([(m.lines, m.cpu_s) for m in points])
        fits.append(Fit(step, cache, slope, intercept, cpu_slope, cpu_intercept, tuple(points)))
    return fits


def limits(step: str) -> tuple[float, int]:
    """Half the step's memory_mb, and its timeout_s."""
    from sluice.contract import STEPS as CONTRACT

    spec = CONTRACT[step]
    return spec.memory_mb / 2, spec.timeout_s


def verdict(f: Fit, lines: int = TARGET_LINES) -> bool:
    half_mb, timeout = limits(f.step)
    return f.upper_mb_at(lines) <= half_mb and f.upper_cpu_at(lines) <= timeout


def table(measures: Sequence[Measure], lines: int = TARGET_LINES) -> str:
    rows = [
        f"{'step':12s} {'cache':>12s}  {'measured (lines: peak MB, CPU s)':60s}  "
        f"{'upper MB at ' + format(lines, ','):>22s}  {'half limit':>10s}  "
        f"{'upper CPU s':>11s}  {'timeout':>7s}  verdict"
    ]
    for f in sorted(fit(measures), key=lambda f: (STEPS.index(f.step) if f.step in STEPS else 99, f.cache)):
        half_mb, timeout = limits(f.step)
        points = "; ".join(f"{m.lines:,}: {m.peak_mb:.0f}, {m.cpu_s:.1f}" for m in f.points)
        cache = f"{f.cache:,}" if f.cache else "empty"
        rows.append(
            f"{f.step:12s} {cache:>12s}  {points:60s}  {f.upper_mb_at(lines):22,.0f}  {half_mb:10,.0f}  "
            f"{f.upper_cpu_at(lines):11,.0f}  {timeout:7d}  {'ok' if verdict(f, lines) else 'OVER'}"
        )
    return "\n".join(rows)


def save(path: Path, measures: Sequence[Measure], notes: dict[str, Any]) -> None:
    body = {"notes": notes, "measures": [dataclasses.asdict(m) for m in measures]}
    path.write_text(json.dumps(body, indent=1) + "\n")


def load(path: Path) -> list[Measure]:
    return [Measure(**m) for m in json.loads(path.read_text())["measures"]]


def plan_input(lines: int) -> Path:
    """The first `lines` lines of the job the big cache was built for (longer jobs: their own file)."""
    WORK.mkdir(parents=True, exist_ok=True)
    whole = WORK / f"cachescale-{max(lines, CACHE_JOB_LINES)}.jsonl"
    if not whole.exists():
        cachescale.make_input(whole, max(lines, CACHE_JOB_LINES))
    if lines >= CACHE_JOB_LINES:
        return whole
    job = WORK / f"cachescale-{CACHE_JOB_LINES}-first-{lines}.jsonl"
    if not job.exists():
        with whole.open("rb") as fh, job.open("wb") as part:
            part.writelines(itertools.islice(fh, lines))
    return job


def cache_dir(answers: int) -> Path:
    """The index cachescale.py builds for these answers (its directory's name as it names it)."""
    import hashlib

    if not answers:
        empty = WORK / "memory-empty-cache"
        empty.mkdir(parents=True, exist_ok=True)
        return empty
    tag = hashlib.sha256(f"{answers}:{CACHE_JOB_LINES}:{CACHE_HITS}".encode()).hexdigest()[:8]
    where = WORK / f"cachescale-{answers}-{tag}"
    if not (where / "index").is_dir():
        print(f"building a {answers:,}-answer index in {where} ...", flush=True)
        started = time.perf_counter()
        cachescale.build(
            where, plan_input(CACHE_JOB_LINES), answers=answers, lines=CACHE_JOB_LINES, share=CACHE_HITS, fresh=False
        )
        print(f"  built in {time.perf_counter() - started:.0f} s", flush=True)
    return where


def _run_child(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", *args]
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def measure(step: str, lines: int, cache_answers: int = 0, *, plant_bytes: int = 0) -> Measure:
    """One run of `step` on a job of `lines` lines in a fresh process."""
    env = {**os.environ, PLANT_ENV: str(plant_bytes)} if plant_bytes else None
    if step == "plan":
        job = plan_input(lines)
        r = _run_child(["plan", "--input", str(job), "--cache", str(cache_dir(cache_answers))], env)
    else:
        with moto_server(MOTO_PATCHES, MOTO_ENV) as endpoint:
            state = merge_fixture(endpoint, step, lines)
            r = _run_child([step, "--endpoint", endpoint, "--state", json.dumps(state)], env)
    return Measure(step, lines, cache_answers, r["peak_mb"], r["cpu_s"], r["baseline_mb"], r["wall_s"])


def measure_all(
    sizes: Sequence[int] = SIZES,
    *,
    steps: Sequence[str] = STEPS,
    cache_answers: int = CACHE_ANSWERS,
    out: Path | None = None,
    notes: dict[str, Any] | None = None,
    kept: Sequence[Measure] = (),
) -> list[Measure]:
    """Every step at every size (Plan with an empty cache and with `cache_answers`), recorded to
    `out` after each point so that a long run keeps what it measured; `kept`, earlier points,
    recorded beside them unless measured again."""
    runs = [(step, cache) for step in steps for cache in ((0, cache_answers) if step == "plan" else (0,))]
    again = {(step, cache, lines) for (step, cache), lines in itertools.product(runs, sizes)}
    measures = [m for m in kept if (m.step, m.cache, m.lines) not in again]
    for (step, cache), lines in itertools.product(runs, sizes):
        started = time.perf_counter()
        m = measure(step, lines, cache)
        measures.append(m)
        print(
            f"{step} {lines:,} lines, cache {cache:,}: peak {m.peak_mb:.0f} MB (after imports {m.baseline_mb:.0f}), "
            f"CPU {m.cpu_s:.1f} s, wall {m.wall_s:.1f} s ({time.perf_counter() - started:.0f} s with its fixture)",
            flush=True,
        )
        if out:
            save(out, measures, notes or {})
    return measures


def merge_fixture(endpoint: str, step: str, lines: int) -> dict[str, Any]:
    """A job in the moto server as bench/merge.py builds one: for Merge every shard finished; for
    MarkFailed a quarter cut short and a quarter never started. Returns its Planned."""
    import boto3
    from sluice.contract import create_table_request
    from sluice.store.jobs import JobStore

    from bench import merge as merge_bench

    shards = max(1, -(-lines // SHARD_LINES))
    if step == "merge":
        kinds = [merge_bench.FINISHED] * shards
    else:
        cycle = (merge_bench.UNFINISHED, merge_bench.NOT_STARTED, merge_bench.FINISHED, merge_bench.FINISHED)
        kinds = [cycle[n % 4] for n in range(shards)]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=merge_bench.BUCKET)
    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1")
    dynamodb.create_table(**create_table_request(merge_bench.TABLE))
    table = boto3.resource("dynamodb", endpoint_url=endpoint, region_name="us-east-1").Table(merge_bench.TABLE)
    store = JobStore(table, ttl_days=1)
    job = merge_bench.Job(
        s3,
        store,
        f"bench-{step}",
        kinds,
        lines=min(lines, SHARD_LINES),
        part_rows=PART_ROWS,
        shard_inputs=True,
        finished_parts=False,
    )
    return job.state.to_dict()


def plan_child(args: argparse.Namespace) -> dict[str, Any]:
    planted = int(os.environ.get(PLANT_ENV) or 0)
    with open(args.input, "rb") as fh:
        held = [bytearray(planted) for _ in fh] if planted else []
    spec = argparse.Namespace(cache=args.cache, input=args.input, no_cache=False, shard_lines=SHARD_LINES)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cachescale.child(spec)
    r = json.loads(printed.getvalue().strip().splitlines()[-1])
    del held
    return {"peak_mb": r["rss_mb"], "cpu_s": r["cpu_s"], "baseline_mb": r["baseline_mb"], "wall_s": r["wall_s"]}


def merge_child(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": args.endpoint,
        }
    )
    import boto3
    from botocore.config import Config
    from sluice.contract import Planned
    from sluice.merge.mark_failed import mark_failed
    from sluice.merge.merge import merge_job
    from sluice.store.jobs import JobStore

    from bench import merge as merge_bench

    # moto completes the 10 GB of results of 10^7 lines in minutes, past botocore's 60 s (a retry
    # then finds the upload gone); S3 keeps the connection alive meanwhile
    s3 = boto3.client("s3", region_name="us-east-1", config=Config(read_timeout=900))
    store = JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table(merge_bench.TABLE), ttl_days=1)
    state = Planned.from_dict(json.loads(args.state))
    baseline = cachescale.peak_rss_mb()
    cpu, started = time.process_time(), time.perf_counter()
    if args.step == "merge":
        merge_job(s3=s3, store=store, state=state)
    else:
        while not mark_failed(s3=s3, store=store, state=state, error="States.TaskFailed", cause="").result.done:
            pass
    return {
        "peak_mb": cachescale.peak_rss_mb(),
        "cpu_s": time.process_time() - cpu,
        "baseline_mb": baseline,
        "wall_s": time.perf_counter() - started,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", choices=("measure", "show"), default="show")
    parser.add_argument("--out", type=Path, default=RECORD, help="the record: measure writes it, show reads it")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="lines, comma-separated")
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--add", action="store_true", help="keep the record's other points beside these")
    parser.add_argument("--cache-answers", type=int, default=CACHE_ANSWERS, help="answers in Plan's big cache")
    parser.add_argument("--child", nargs="?", const="", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.child is not None:
        args.step = args.child or (rest[0] if rest else "")
        print(json.dumps(plan_child(args) if args.step == "plan" else merge_child(args)))
        return
    if args.command == "measure":
        sizes = [int(s) for s in args.sizes.split(",")]
        notes = {
            "machine": f"{os.cpu_count()} cores, local disk; moto server for Merge and MarkFailed",
            "cache_answers": args.cache_answers,
            "shard_lines": SHARD_LINES,
            "part_rows": PART_ROWS,
        }
        kept = load(args.out) if args.add and args.out.exists() else []
        steps = args.steps.split(",")
        measure_all(sizes, steps=steps, cache_answers=args.cache_answers, out=args.out, notes=notes, kept=kept)
    print(table(load(args.out)))


if __name__ == "__main__":
    main()
