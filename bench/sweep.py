"""The last sweep under random faults: lines in errors per run, with the sweep and without it.

Each run is a direct-mode job of --lines lines through the local cloud, against the
simulator answering --rate-429 of attempts with a 429 and --rate-500 with a 500, at random
(each run's custom ids are new, so its faults are new draws). "without" is the same run's
count of lines whose attempts ran out in the main pass: the lines that went to errors before
the sweep existed. "with" is the lines in the job's errors file. Target: 0 in every run.

    .venv/bin/python bench/sweep.py --runs 10 --lines 2000 --rate-429 0.1 --rate-500 0.05
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

from sluice_local.cloud import LocalCloud, LocalSettings, run_job  # noqa: E402
from sluice_local.simulator import SimConfig, SimulatorServer  # noqa: E402
from tests.conftest import request_line  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--rate-429", type=float, default=0.1)
    parser.add_argument("--rate-500", type=float, default=0.05)
    parser.add_argument("--max-attempts", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--retry-after", type=float, default=1.0, help="the simulator's Retry-After on a 429 (s)")
    parser.add_argument("--latency", type=float, default=0.01)
    args = parser.parse_args()

    config = SimConfig(
        latency_s=args.latency, seed=16, rate_429=args.rate_429, rate_500=args.rate_500, retry_after_s=args.retry_after
    )
    # every run asks the provider: a cache filled by an earlier run would answer it instead
    settings = LocalSettings(
        cache="off", concurrency=args.concurrency, max_attempts=args.max_attempts, request_timeout_s=30.0
    )
    print(
        f"{args.runs} runs of {args.lines:,} lines, direct mode, {args.concurrency} in flight, "
        f"{args.max_attempts} attempts a line; faults 429={args.rate_429} 500={args.rate_500}"
    )
    print(f"{'run':>3}  {'without':>7}  {'with':>4}  {'swept':>5}  {'recovered':>9}  {'wall s':>6}  status")
    without_total = with_total = 0
    bad_runs = 0
    with (
        tempfile.TemporaryDirectory() as tmp,
        SimulatorServer(config) as sim,
    ):
        cloud = LocalCloud(provider_base_url=sim.base_url, api_key="sk-bench", settings=settings)
        with cloud.running():
            for n in range(1, args.runs + 1):
                path = Path(tmp) / f"sweep-{n}.jsonl"
                path.write_bytes(b"".join(request_line(f"r{n}-{i}", f"line {i}") for i in range(args.lines)))
                started = time.monotonic()
                run = run_job(cloud, path)
                wall = time.monotonic() - started
                sweep = run.summary.get("sweep", {})
                swept, recovered = int(sweep.get("swept", 0)), int(sweep.get("recovered", 0))
                codes = Counter(e["error"]["code"] for e in run.errors)
                report = run.verify(path)
                without = swept
                with_sweep = len(run.errors)
                without_total += without
                with_total += with_sweep
                bad_runs += with_sweep > 0
                state = run.status + ("" if report.ok else " (verify failed: " + report.describe() + ")")
                print(
                    f"{n:>3}  {without:>7}  {with_sweep:>4}  {swept:>5}  {recovered:>9}  {wall:>6.1f}  {state}"
                    + (f" {dict(codes)}" if codes else "")
                )
                sim.clear_log()
    print(
        f"lines in errors over {args.runs} runs: {with_total} with the sweep ({bad_runs} runs above 0), "
        f"{without_total} without it (the same runs' lines whose attempts ran out before the sweep)"
    )
    return 0 if with_total == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
