"""Random faults never end a line: today's six attempts a line against attempts sized to the job.

Each run is a direct-mode job of --lines lines through the local cloud, against the simulator
answering --rate-429 of attempts with a 429 (Retry-After: --retry-after) and --rate-500 with a
500, each attempt drawn independently. Each run's custom ids are new, so its faults are new
draws; the two variants get a simulator each with the same seed, so run n's lines meet the same
faults on the same attempts in both ("6": --max-attempts 6, the old default; "job": no cap, the
new default). A line the 6 column loses is one the job column sent more than 6 times.

    .venv/bin/python bench/faults.py --runs 10 --lines 2000 --rate-429 0.1 --rate-500 0.05

Under random faults at rate p a line of k attempts ends in errors with chance p**k: at p = 0.15,
six attempts lose 11 lines a million (1.1e-5 a line), and the job's ten lose 0.006.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

from sluice_local.cloud import LocalCloud, LocalSettings, run_job  # noqa: E402
from sluice_local.simulator import SimConfig, SimulatorServer  # noqa: E402
from tests.conftest import request_line  # noqa: E402

VARIANTS = {"6": 6, "job": 0}


@dataclass
class Ran:
    errors: int
    codes: dict[str, int]
    wall_s: float
    attempts: int
    longest: int
    swept: int
    recovered: int
    status: str


def one_run(cloud: LocalCloud, path: Path) -> Ran:
    started = time.monotonic()
    run = run_job(cloud, path)
    wall = time.monotonic() - started
    report = run.verify(path)
    summary = run.summary
    sweep = summary.get("sweep") or {}
    return Ran(
        errors=len(run.errors),
        codes=dict(Counter(e["error"]["code"] for e in run.errors)),
        wall_s=wall,
        attempts=int(summary.get("attempts") or 0),
        longest=int(summary.get("max_line_attempts") or 0),
        swept=int(sweep.get("swept") or 0),
        recovered=int(sweep.get("recovered") or 0),
        # the job's own word (COMPLETED_WITH_ERRORS), not its execution's (SUCCEEDED)
        status=str(summary.get("status") or run.status)
        + ("" if report.ok else " (verify failed: " + report.describe() + ")"),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--rate-429", type=float, default=0.1)
    parser.add_argument("--rate-500", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--retry-after", type=float, default=1.0, help="the simulator's Retry-After on a 429 (s)")
    parser.add_argument("--latency", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=61)
    args = parser.parse_args()

    config = SimConfig(
        latency_s=args.latency,
        seed=args.seed,
        rate_429=args.rate_429,
        rate_500=args.rate_500,
        retry_after_s=args.retry_after,
    )
    print(
        f"{args.runs} runs of {args.lines:,} lines, direct mode, {args.concurrency} in flight; "
        f"faults 429={args.rate_429} 500={args.rate_500} (seed {args.seed})"
    )
    ran: dict[str, list[Ran]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for n in range(1, args.runs + 1):
            path = Path(tmp) / f"faults-{n}.jsonl"
            path.write_bytes(b"".join(request_line(f"r{n}-{i}", f"line {i}") for i in range(args.lines)))
            paths.append(path)
        for name, cap in VARIANTS.items():
            # every run asks the provider: a cache filled by an earlier run would answer it instead
            settings = LocalSettings(
                cache="off", concurrency=args.concurrency, max_attempts=cap, request_timeout_s=30.0
            )
            with SimulatorServer(config) as sim:
                cloud = LocalCloud(provider_base_url=sim.base_url, api_key="sk-bench", settings=settings)
                with cloud.running():
                    ran[name] = []
                    for path in paths:
                        ran[name].append(one_run(cloud, path))
                        sim.clear_log()
                        r = ran[name][-1]
                        print(
                            f"  {name:>3} {path.stem}: {r.errors} errors, {r.wall_s:.1f} s, longest line "
                            f"{r.longest} attempts, {r.status}",
                            flush=True,
                        )
    print()
    header = "errors  wall s  attempts  longest  swept  recovered"
    print(f"{'run':>3}  {'6 attempts a line':^{len(header)}}  |  {'as the job needs':^{len(header)}}")
    print(f"{'':>3}  {header}  |  {header}")
    for n in range(args.runs):
        cells = []
        for name in VARIANTS:
            r = ran[name][n]
            cells.append(
                f"{r.errors:>6}  {r.wall_s:>6.1f}  {r.attempts:>8,}  {r.longest:>7}  {r.swept:>5}  {r.recovered:>9}"
            )
        print(f"{n + 1:>3}  " + "  |  ".join(cells))
    for name in VARIANTS:
        runs = ran[name]
        walls = sorted(r.wall_s for r in runs)
        codes: Counter[str] = Counter()
        for r in runs:
            codes.update(r.codes)
        label = "6 attempts a line" if name == "6" else "as the job needs"
        by_code = f" {dict(codes)}" if codes else ""
        print(
            f"{label}: {sum(r.errors for r in runs)} lines in errors over {len(runs)} runs "
            f"({sum(r.errors > 0 for r in runs)} runs above 0){by_code}; "
            f"wall {walls[0]:.1f} to {walls[-1]:.1f} s, mean {sum(walls) / len(walls):.1f} s; "
            f"longest line {max(r.longest for r in runs)} attempts; "
            f"{sum(r.attempts for r in runs):,} attempts in all"
        )
    return 0 if all(r.errors == 0 for r in ran["job"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
