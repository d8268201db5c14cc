"""End to end: N lines through the local pipeline (moto + the real state machine and handlers)
against the simulator in its own process, compared with the ideal N * latency / concurrency.

    .venv/bin/python bench/e2e.py --lines 50000 --latency 1 --concurrency 1000
    .venv/bin/python bench/e2e.py --lines 50000 --rate-429 0.1 --rate-500 0.05   # under faults
    .venv/bin/python bench/e2e.py --profile   # pyinstrument profile of the pipeline process
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# generated inputs and profiles: under out/, which git ignores
WORK = ROOT / "out" / "bench"
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_input(path: Path, lines: int) -> None:
    with path.open("w") as fh:
        for n in range(lines):
            url = "/v1/chat/completions" if n % 2 == 0 else "/v1/responses"
            prompt = f"Reply with one word, positive or negative:\n\nReview {n}: great value, works well."
            body = (
                {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
                if n % 2 == 0
                else {"model": "gpt-4o-mini", "input": prompt, "max_output_tokens": 16}
            )
            fh.write(json.dumps({"custom_id": f"r-{n}", "method": "POST", "url": url, "body": body}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=1000, help="requests in flight for the whole job")
    parser.add_argument("--map-concurrency", type=int, default=10)
    parser.add_argument("--shard-lines", type=int, default=5000)
    parser.add_argument("--rate-429", type=float, default=0.0)
    parser.add_argument("--rate-500", type=float, default=0.0)
    parser.add_argument("--profile", action="store_true", help="profile with pyinstrument (pip install pyinstrument)")
    args = parser.parse_args()

    from sluice_local.cloud import LocalCloud, LocalSettings, run_job

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
            "--rate-429",
            str(args.rate_429),
            "--rate-500",
            str(args.rate_500),
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
        path = WORK / f"e2e-{args.lines}.jsonl"
        make_input(path, args.lines)
        settings = LocalSettings(
            # every run asks the provider: a cache filled by an earlier run would answer it instead
            cache="off",
            concurrency=args.concurrency,
            map_concurrency=args.map_concurrency,
            shard_lines=args.shard_lines,
            request_timeout_s=30.0,
        )
        cloud = LocalCloud(provider_base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-bench", settings=settings)
        profiler = None
        if args.profile:
            from pyinstrument import Profiler

            profiler = Profiler(async_mode="disabled")
        with cloud.running():
            if profiler:
                profiler.start()
            started = time.monotonic()
            cpu0 = time.process_time()
            run = run_job(cloud, path)
            wall = time.monotonic() - started
            cpu = time.process_time() - cpu0
            if profiler:
                profiler.stop()
        ideal = args.lines * args.latency / args.concurrency
        results = {r["custom_id"] for r in run.results}
        errors = Counter(e["error"]["code"] for e in run.errors)
        lost = args.lines - len(results) - sum(errors.values())
        print(
            f"{args.lines:,} lines, latency {args.latency} s, {args.concurrency} in flight "
            f"({args.map_concurrency} shards at a time), faults 429={args.rate_429} 500={args.rate_500}; 2 cores"
        )
        print(f"status {run.status}: {len(results):,} results, errors {dict(errors)}, lost {lost}")
        summary = run.summary
        print(
            f"wall {wall:.1f} s, ideal {ideal:.1f} s, wall/ideal {wall / ideal:.2f}x (target <= 1.5x); "
            f"pipeline process CPU {cpu:.1f} s ({cpu / args.lines * 1000:.2f} ms/request); "
            f"retries {summary.get('retries')}, throttled {summary.get('throttled')}, "
            "latency p50/p95/p99 {p50}/{p95}/{p99} s".format(**summary["latency_s"])
        )
        steps = Counter(i.step for i in cloud.invocations)
        print(f"Lambda invocations: {dict(steps)}")
        if profiler:
            out = WORK / "e2e-profile.txt"
            out.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
            print(f"profile: {out}")
        path.unlink()
    finally:
        sim.terminate()
        sim.wait()


if __name__ == "__main__":
    main()
