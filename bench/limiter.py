"""The shared rate limit against a provider's per-key quota, each figure with its reference.

The simulator enforces --rpm requests a minute per API key (bucket full at start, continuous
refill, Retry-After, rate-limit headers on every answer). The local cloud runs the jobs
(moto, in-process Lambdas, IAM enforced) with no rate configured, so the shared limit must
learn it from the headers:

  one job    --lines lines in shards of --shard-lines, shared limit on; reference: off.
  two jobs   two jobs of --lines / 2 lines at once on the same key, shared limit on;
             reference: off.
  tpm        (with --tpm N) one job against a key whose tokens-per-minute quota binds first
             (N tokens a minute; the request quota is ten times --rpm): tokens a minute
             against N. Reference: off.
  seeded     (with --seeded) one job with the quota given in the environment's rate_limits,
             so the bucket is full and sized before the first answer. Reference: not seeded.

Each figure: 429s among all attempts, accepted requests (and with --tpm, tokens) a minute
against the quota (for the whole run and per job), the shared limit's DynamoDB writes per line,
and how the shards of each job split the rate (each shard's lines a second, from its first
attempt to its last). The simulator's bucket is full when a run starts, so the first
line also gives the time of the one job as the quota allows it: the full bucket spent at once,
then the rate, and, for comparison, paced from a 10 s burst.

    .venv/bin/python bench/limiter.py --rpm 1200 --lines 2400 --shard-lines 300
    .venv/bin/python bench/limiter.py --only tpm --tpm 20000 --lines 1200 --shard-lines 150
    .venv/bin/python bench/limiter.py --only seeded --seeded
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

import boto3  # noqa: E402
import orjson  # noqa: E402

from sluice_local.cloud import REGION, JobRun, LocalCloud, LocalSettings, run_job  # noqa: E402
from sluice_local.simulator import SimConfig, SimulatorServer  # noqa: E402

WORK = ROOT / ".work"
FIGURES = ("one", "two", "tpm", "seeded")


def make_input(path: Path, lines: int, prefix: str) -> None:
    with path.open("wb") as out:
        for n in range(lines):
            body = {
                "model": "gpt-4o-mini",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"Reply with one word: line {n} was great"}],
            }
            row = {"custom_id": f"{prefix}-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            out.write(orjson.dumps(row) + b"\n")


@dataclass
class Job:
    prefix: str
    run: JobRun | None = None
    wall_s: float = 0.0


def run_jobs(args: argparse.Namespace, shared: str, jobs: int, *, tpm: int = 0, seeded: bool = False) -> None:
    lines = args.lines // jobs
    # with a token quota, the request quota is set well above what the tokens allow, so tokens bind
    rpm = args.rpm * 10 if tpm else args.rpm
    seed = {"gpt-4o-mini": {"rpm": rpm, **({"tpm": tpm} if tpm else {})}}
    settings = LocalSettings(
        # every run asks the provider: a cache filled by an earlier run would answer it instead
        cache="off",
        concurrency=args.concurrency,
        map_concurrency=args.map_concurrency,
        shard_lines=args.shard_lines,
        request_timeout_s=30.0,
        shared_limit=shared,
        rate_limits=json.dumps(seed) if seeded else None,
    )
    config = SimConfig(latency_s=args.latency, quota_rpm=rpm, quota_tpm=tpm)
    WORK.mkdir(parents=True, exist_ok=True)
    started_jobs = [Job(chr(ord("a") + i)) for i in range(jobs)]
    paths = []
    for job in started_jobs:
        path = WORK / f"limiter-{job.prefix}-{lines}.jsonl"
        make_input(path, lines, job.prefix)
        paths.append(path)
    with SimulatorServer(config) as sim:
        cloud = LocalCloud(provider_base_url=sim.base_url, api_key="sk-bench-limiter", settings=settings)
        with cloud.running():

            def one(job: Job, path: Path) -> None:
                started = time.monotonic()
                job.run = run_job(cloud, path)
                job.wall_s = time.monotonic() - started

            t0 = time.monotonic()
            threads = [
                threading.Thread(target=one, args=(job, path)) for job, path in zip(started_jobs, paths, strict=True)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.monotonic() - t0
            writes = limit_writes(cloud)
        log = sim.log
    for path in paths:
        path.unlink()
    label = f"shared limit {shared}" + (", seeded" if seeded else "")
    report(args, label, started_jobs, log, wall, lines, writes, tpm=tpm)


def limit_writes(cloud: LocalCloud) -> int | None:
    """The shared limit's writes, read back from its items' versions (each write adds one)."""
    table = boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name)
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {}
    while True:
        page = table.scan(**kwargs)
        items += [i for i in page["Items"] if str(i["pk"]).startswith("LIMIT#")]
        if "LastEvaluatedKey" not in page:
            break
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    return sum(int(i["version"]) for i in items) if items else None


def report(
    args: argparse.Namespace,
    shared: str,
    jobs: list[Job],
    log: list[dict[str, Any]],
    wall: float,
    lines: int,
    writes: int | None,
    *,
    tpm: int = 0,
) -> None:
    calls = [e for e in log if e["path"].endswith("/chat/completions")]
    statuses = Counter(e["status"] for e in calls)
    attempts = len(calls)
    limited = statuses[429]
    accepted = statuses[200]
    rate = accepted / wall * 60
    label = f"{len(jobs)} job{'s' if len(jobs) > 1 else ''}, {shared}"
    if tpm:
        used = 0
        for job in jobs:
            assert job.run is not None
            tokens = job.run.summary.get("tokens") or {}
            used += int(tokens.get("input", 0)) + int(tokens.get("output", 0))
        token_rate = used / wall * 60
        against = f"{token_rate:7,.0f} tokens/min = {token_rate / tpm:4.0%} of the TPM quota ({rate:,.0f} requests/min)"
    else:
        against = f"{rate:6,.0f}/min = {rate / args.rpm:4.0%} of the quota"
    print(
        f"{label:34} {attempts:6,} attempts, {limited:5,} 429 ({limited / attempts:5.1%}), {accepted:6,} accepted "
        f"in {wall:6.1f} s = {against}"
        + (f"; limit writes {writes} = {writes / (lines * len(jobs)):.3f}/line" if writes is not None else ""),
        flush=True,
    )
    per_job = []
    for job in jobs:
        assert job.run is not None
        done = len(job.run.results)
        job_rate = done / job.wall_s * 60
        per_job.append(job_rate)
        job_429 = sum(
            1 for e in calls if e["status"] == 429 and str(e.get("custom_id", "")).startswith(job.prefix + "-")
        )
        print(
            f"    job {job.prefix}: {job.run.status}, {done:,}/{lines:,} results, {len(job.run.errors)} errors, "
            f"{job_429} 429s, {job.wall_s:.1f} s = {job_rate:,.0f} lines/min",
            flush=True,
        )
        rates = shard_rates(calls, job.prefix, args.shard_lines)
        if len(rates) > 1:
            print(
                f"      shards' lines/s: {' '.join(f'{r:.1f}' for r in rates)}; "
                f"slowest = {min(rates) / max(rates):.0%} of the fastest",
                flush=True,
            )
    if len(per_job) > 1:
        print(f"    slower job's throughput = {min(per_job) / max(per_job):.0%} of the faster's", flush=True)


def shard_rates(calls: list[dict[str, Any]], prefix: str, shard_lines: int) -> list[float]:
    """Each shard's accepted lines a second, from its first attempt to its last (the simulator logs
    when a request arrives)."""
    spans: dict[int, list[float]] = {}
    accepted: Counter[int] = Counter()
    for e in calls:
        custom_id = str(e.get("custom_id", ""))
        if not custom_id.startswith(prefix + "-"):
            continue
        shard = int(custom_id.rsplit("-", 1)[1]) // shard_lines
        span = spans.setdefault(shard, [e["t"], e["t"]])
        span[0], span[1] = min(span[0], e["t"]), max(span[1], e["t"])
        accepted[shard] += e["status"] == 200
    return [accepted[s] / max(1e-9, end - start) for s, (start, end) in sorted(spans.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpm", type=int, default=1200, help="the key's quota, requests a minute")
    parser.add_argument("--lines", type=int, default=2400, help="lines in all (two jobs: half each)")
    parser.add_argument("--shard-lines", type=int, default=300)
    parser.add_argument("--map-concurrency", type=int, default=8, help="shards at a time, per job")
    parser.add_argument("--concurrency", type=int, default=1000, help="requests in flight per job")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per answer")
    parser.add_argument("--only", choices=FIGURES, help="run one of the figures")
    parser.add_argument("--tpm", type=int, default=0, help="also run the TPM-bound figure at this TPM quota")
    parser.add_argument("--seeded", action="store_true", help="also run the figure seeded from rate_limits")
    parser.add_argument("--no-reference", action="store_true", help="skip the runs with the shared limit off")
    args = parser.parse_args()
    print(
        f"quota {args.rpm:,} RPM per key, latency {args.latency} s; {args.lines:,} lines in shards of "
        f"{args.shard_lines}, {args.map_concurrency} shards at a time per job; no rate configured"
        + (" (but in the seeded figure)" if args.seeded or args.only == "seeded" else ""),
        flush=True,
    )
    chosen = (
        [args.only]
        if args.only
        else ["one", "two", *(["tpm"] if args.tpm else []), *(["seeded"] if args.seeded else [])]
    )
    if chosen != ["tpm"]:
        per_s = args.rpm / 60
        print(
            f"the quota allows {args.lines:,} lines in {max(0, args.lines - args.rpm) / per_s:.0f} s (its full "
            f"bucket spent at once, then {per_s:g}/s); paced from a 10 s burst, "
            f"{max(0, args.lines - per_s * 10) / per_s:.0f} s",
            flush=True,
        )
    for figure in chosen:
        if figure == "tpm":
            if not args.tpm:
                parser.error("--only tpm needs --tpm N")
            print(f"TPM quota {args.tpm:,} tokens a minute, request quota {args.rpm * 10:,} RPM", flush=True)
            run_jobs(args, "on", 1, tpm=args.tpm)
            if not args.no_reference:
                run_jobs(args, "off", 1, tpm=args.tpm)
        elif figure == "seeded":
            run_jobs(args, "on", 1, seeded=True)
            if not args.no_reference:
                run_jobs(args, "on", 1)
        else:
            jobs = 1 if figure == "one" else 2
            run_jobs(args, "on", jobs)
            if not args.no_reference:
                run_jobs(args, "off", jobs)


if __name__ == "__main__":
    main()
