"""The response cache on the deployed path (moto S3 `cache/`, the real state machine and handlers):
a re-run that is all hits against Plan alone, and a cold run with the cache on against it off.

    .venv/bin/python bench/cache.py --lines 50000 --repeat 2

Each cold pair runs cache-off and cache-on on an emptied cache, `--repeat` times, in ABBA order
(off-on, on-off, ...). The bench prints best against best (noise on a shared machine only adds
time), each pair's ratio, and the ratio of the means. The process drifts from job to job (each
job here ran about 1% slower than the one before): over an even `--repeat` the drift falls
equally on both, so the ratio of the means is free of it; best against best and the pairs'
median are not (whichever job ran earlier had less drift). The all-hits re-run uploads the same
content under a new key (a new job), after a cold run filled the cache.

`--map-concurrency` is how many shards run at once in this one interpreter (10, as the Map
state runs them). With 1, each shard has the interpreter to itself while it runs, as each
shard's Lambda has its own on AWS: the ten shards' loops then no longer wait on one another's
work, which multiplies any work between answers here (`--probe-busy`). `--ablate` adds cache-on
runs with the shards' fill cut back a step at a time, to show what each step costs.

A job's time is its execution's, from start to stop as Step Functions reports them: what the
user waits for once the file is in the bucket (uploading it and reading the results back are
the same with the cache or without). Each cold job's CPU time in this process (the cloud, the
handlers, moto; not the simulator) is printed too: what the cache adds to a cold run is work,
and CPU time measures work more steadily than wall time on a shared machine. CPU is counted
from the execution's start to its end; after each job the objects moto keeps are frozen out of
the garbage collector (`gc.freeze`), or every job's full collections would scan all earlier
jobs' objects too; and each job's objects but the cache's are deleted once it is measured.
moto keeps every object in memory here, none in temporary files on disk.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "out" / "bench"
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

from bench.e2e import free_port, make_input  # noqa: E402


def step_seconds(cloud: Any, since: int, step: str) -> float:
    """A Lambda's own time in the job that started after invocation `since`."""
    return sum(i.seconds for i in cloud.invocations[since:] if i.step == step)


def cpu_seconds() -> float:
    """This process's CPU time: the local cloud, the handlers and moto, not the simulator."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def busy_work(microseconds: float) -> Any:
    """A call that takes about `microseconds` of CPU (SHA-256 of a buffer sized to it, here and now)."""
    import hashlib

    probe = b"x" * 64_000
    start = time.process_time()
    for _ in range(2000):
        hashlib.sha256(probe).digest()
    per_byte = (time.process_time() - start) / 2000 / len(probe)
    blob = b"x" * max(1, int(microseconds * 1e-6 / per_byte))
    return lambda: hashlib.sha256(blob).digest()


ABLATIONS = {
    "no-write": "the cache on, no segment or index written",
    "no-filing": "... and no answer filed",
    "no-keys": "... and no key hashed",
}


@contextlib.contextmanager
def ablate(kind: str) -> Iterator[None]:
    """Shards fill the cache with their work cut back up to `kind` (a key of ABLATIONS, each of
    which also cuts the ones before it); any other kind cuts nothing."""
    from sluice.cache.entries import CacheFill

    steps = list(ABLATIONS)
    cuts = steps[: steps.index(kind) + 1] if kind in ABLATIONS else []
    saved = {name: CacheFill.__dict__[name] for name in ("write", "add", "track")}
    try:
        if "no-write" in cuts:
            CacheFill.write = lambda self, filled: None  # type: ignore[method-assign]
        if "no-filing" in cuts:
            CacheFill.add = lambda self, outcome, record, usage=None: None  # type: ignore[method-assign]
        if "no-keys" in cuts:
            CacheFill.track = lambda self, requests: iter(requests)  # type: ignore[method-assign]
        yield
    finally:
        for name, method in saved.items():
            setattr(CacheFill, name, method)


def forget(s3: Any, bucket: str) -> None:
    """Delete every object of the bucket but the response cache's."""
    from sluice.contract import CACHE_PREFIX

    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", []) if not o["Key"].startswith(CACHE_PREFIX)]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def execution_seconds(run: Any) -> float:
    return float((run.execution["stopDate"] - run.execution["startDate"]).total_seconds())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--shard-lines", type=int, default=5000)
    parser.add_argument("--map-concurrency", type=int, default=10, help="shards run at once (the Map state's)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--skip-cold", action="store_true", help="only the all-hits re-run")
    parser.add_argument(
        "--probe-busy",
        type=float,
        default=0.0,
        metavar="US",
        help="also time cache-off runs that do US microseconds more work an answer (hashing, timed "
        "alone): what any per-answer work costs a run of this local cloud",
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="also time cache-on runs with the shards' fill cut back step by step (no segment or index "
        "written; nothing filed either; no key hashed either): where the cache's cost goes",
    )
    args = parser.parse_args()
    # moto keeps an object over 5 MiB in a temporary file on this machine's disk, which wrote at
    # 70 MB/s at times here: S3's storage on AWS, which no Lambda waits on. Kept in memory, the
    # disk's mood stays out of both figures (Merge's copy of a 44 MB output took 0.1 to 0.8 s).
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(1 << 30))

    import boto3
    from sluice.cache.entries import S3Store, clear
    from sluice.plan.plan import job_id_for, output_prefix

    from sluice_local.cloud import REGION, JobRun, LocalCloud, LocalSettings, run_job

    port = free_port()
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluice_local.simulator",
            "--port",
            str(port),
            "--latency",
            str(args.latency),
            "--seed",
            "7",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        WORK.mkdir(parents=True, exist_ok=True)
        path = WORK / f"cache-{args.lines}.jsonl"
        make_input(path, args.lines)
        settings = LocalSettings(
            concurrency=args.concurrency,
            shard_lines=args.shard_lines,
            map_concurrency=args.map_concurrency,
            request_timeout_s=30.0,
        )
        cloud = LocalCloud(provider_base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-bench", settings=settings)
        walls: dict[str, list[float]] = {"off": [], "on": []}
        cpus: dict[str, list[float]] = {"off": [], "on": []}
        plans: list[float] = []
        with cloud.running():
            s3 = boto3.client("s3", region_name=REGION)
            store = S3Store(s3, cloud.bucket)

            def job(name: str, cache: str) -> tuple[float, float, float, Any]:
                since = len(cloud.invocations)
                key, etag = cloud.upload(path, key=f"inbox/{name}.jsonl", metadata={"sluice-cache": cache})
                cpu = cpu_seconds()
                event = cloud.object_created_event(key, etag)
                execution = cloud.wait(cloud.start(event, name=f"{name}-{time.time_ns()}"))
                cpu = cpu_seconds() - cpu
                summary = orjson.loads(cloud.read(output_prefix(key) + ".summary.json"))
                # the results are not read back: the figures need the execution and the summary only
                run = JobRun(job_id_for(cloud.bucket, key, etag), execution, [], [], summary)
                assert run.status == "SUCCEEDED", run.summary.get("error")
                # what moto keeps of this job is history to the next: its objects are deleted (all
                # but the cache's) and the rest frozen out of the collector, so that each job starts
                # where the first did, as a Lambda does, instead of scanning and paging through every
                # earlier job's (full collections took up to 1.5 s a job, growing job by job)
                forget(s3, cloud.bucket)
                gc.collect()
                gc.freeze()
                wall = execution_seconds(run)
                plan, merge = step_seconds(cloud, since, "plan"), step_seconds(cloud, since, "merge")
                shards = sum(1 for i in cloud.invocations[since:] if i.step == "run_shard")
                print(
                    f"  {name}: {wall:.2f} s (Plan {plan:.2f} s, {shards} shard runs, Merge {merge:.2f} s; "
                    f"CPU {cpu:.1f} s)",
                    flush=True,
                )
                return wall, plan, cpu, run

            # the first job of a cloud pays for importing every handler: not part of either figure
            warm = WORK / "cache-warm.jsonl"
            make_input(warm, 200)
            run_job(cloud, warm, key="inbox/warm.jsonl", metadata={"sluice-cache": "off"})
            warm.unlink()
            from sluice.shard.parts import PartWriter

            add_outcome = PartWriter.add_outcome
            work = busy_work(args.probe_busy) if args.probe_busy else None

            def busy_add_outcome(self: Any, *a: Any, **k: Any) -> None:
                assert work is not None
                work()
                add_outcome(self, *a, **k)

            busy_walls: list[float] = []
            ablations = list(ABLATIONS) if args.ablate else []
            kinds = ["off", "on"] + (["busy"] if work is not None else []) + ablations
            ablated: dict[str, list[tuple[float, float]]] = {kind: [] for kind in ablations}
            for n in range(0 if args.skip_cold else args.repeat):
                # rotate which goes first, so none always runs on a warmer process
                for kind in kinds[n % len(kinds) :] + kinds[: n % len(kinds)]:
                    clear(store)
                    cache = "off" if kind in ("off", "busy") else "on"
                    if kind == "busy":
                        PartWriter.add_outcome = busy_add_outcome  # type: ignore[method-assign]
                    try:
                        with ablate(kind):
                            wall, plan, cpu, run = job(f"cold-{kind}-{n}", cache)
                    finally:
                        PartWriter.add_outcome = add_outcome  # type: ignore[method-assign]
                    assert run.summary["cache"]["hits"] == 0
                    if kind == "busy":
                        busy_walls.append(wall)
                        continue
                    if kind in ablated:
                        ablated[kind].append((wall, cpu))
                        continue
                    walls[cache].append(wall)
                    cpus[cache].append(cpu)
                    if cache == "off":
                        plans.append(plan)
            clear(store)
            job("fill", "write")
            hit_walls: list[float] = []
            hit_plans: list[float] = []
            for n in range(args.repeat):
                wall, plan, _, run = job(f"hits-{n}", "on")
                assert run.summary["cache"]["hits"] == args.lines and run.summary["cache"]["misses"] == 0
                hit_walls.append(wall)
                hit_plans.append(plan)
            listed = store.listing("", recursive=True)
            objects, size = len(listed), sum(e.size for e in listed)
        path.unlink()
        print(
            f"{args.lines:,} lines, simulator latency {args.latency} s, {args.concurrency} in flight, "
            f"shards of {args.shard_lines}, {args.map_concurrency} at once; moto in-process, IAM enforced; 2 cores"
        )
        print(f"cache: {objects} objects, {size / 1e6:.1f} MB in cache/ (segments and indexes)")
        best = min(range(len(hit_walls)), key=hit_walls.__getitem__)
        rerun, its_plan = hit_walls[best], hit_plans[best]
        print(
            f"all-hits re-run: whole job {', '.join(f'{w:.2f}' for w in hit_walls)} s "
            f"(its Plan {', '.join(f'{p:.2f}' for p in hit_plans)} s); "
            f"Plan of a cache-off run {', '.join(f'{p:.2f}' for p in plans)} s"
        )
        print(f"re-run / its Plan step alone: {rerun / its_plan:.2f}x   (target <= 1.5x)")
        each = [w / p for w, p in zip(hit_walls, hit_plans, strict=True)]
        print(f"  run by run: {', '.join(f'{r:.2f}' for r in each)}x; median {statistics.median(each):.2f}x")
        if plans:
            print(f"re-run / Plan of a cache-off run: {rerun / min(plans):.2f}x")
        if args.skip_cold:
            return
        off, on = min(walls["off"]), min(walls["on"])
        print(
            f"cold run: cache off {', '.join(f'{w:.2f}' for w in walls['off'])} s, "
            f"cache on {', '.join(f'{w:.2f}' for w in walls['on'])} s"
        )
        print(f"cold on / off: {on / off:.3f}x   (target <= 1.05x)")
        # each pair ran back to back, so its ratio cancels the drift between pairs (not within one)
        pairs = sorted(b / a for a, b in zip(walls["off"], walls["on"], strict=True))
        print(
            f"cold on / off, pair by pair: {', '.join(f'{r:.3f}' for r in pairs)}x; "
            f"median {statistics.median(pairs):.3f}x"
        )
        mean_off, mean_on = statistics.mean(walls["off"]), statistics.mean(walls["on"])
        even = (
            ""
            if args.repeat % len(kinds) == 0
            else f" (--repeat not a multiple of {len(kinds)}: the drift does not cancel)"
        )
        order = "ABBA order" if len(kinds) == 2 else "rotated order"
        print(f"cold mean on / mean off, {order}: {mean_on / mean_off:.3f}x{even}")
        # the wall time of a cold run swings by more than 5% from run to run on a shared machine;
        # the CPU the cache adds is the steadier measure of its cost
        cpu_off, cpu_on = statistics.mean(cpus["off"]), statistics.mean(cpus["on"])
        print(f"cold CPU (mean, this process): cache off {cpu_off:.1f} s, on {cpu_on:.1f} s: {cpu_on / cpu_off:.3f}x")
        if busy_walls:
            alone = args.probe_busy * args.lines / 1e6
            print(
                f"cache off, {args.probe_busy:g} us more work an answer: "
                f"{', '.join(f'{w:.2f}' for w in busy_walls)} s; best / best cache off {min(busy_walls) / off:.3f}x "
                f"(that work alone: {alone:.2f} s, {alone / off:.1%} of the run)"
            )
            rounds = sorted(b / a for a, b in zip(walls["off"], busy_walls, strict=True))
            print(
                f"  round by round against cache off: {', '.join(f'{r:.3f}' for r in rounds)}x; "
                f"median {statistics.median(rounds):.3f}x"
            )
        if ablated:
            print("where the cache's cold cost goes (means over the rounds, against cache off):")
            for kind, runs in [("on", list(zip(walls["on"], cpus["on"], strict=True))), *ablated.items()]:
                wall = statistics.mean(w for w, _ in runs)
                cpu = statistics.mean(c for _, c in runs)
                print(
                    f"  {ABLATIONS.get(kind, 'the cache on'):44s} wall {wall:.2f} s, {wall / mean_off:.3f}x; "
                    f"CPU {cpu:.2f} s, {cpu / cpu_off:.3f}x"
                )
    finally:
        sim.terminate()
        sim.wait()


if __name__ == "__main__":
    main()
