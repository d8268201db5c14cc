"""A job with a deadline, in the cases that proved its plan, on the local cloud and the
built-in simulator with its batch turnaround set to a duration.

- late: the job expects a batch in `--expect-s`, the simulator's takes `--turnaround-s` (longer than
  the deadline allows). The plan batches, the batches are cancelled at the cutover, their answers
  kept, the rest sent direct. It must end before the deadline, cost less than all direct, and the
  simulator's journal must show no custom_id answered twice (by a batch and direct, or twice by one).
- meets: a deadline the batch meets: all batch, provider cost half of all direct.
- refused: a deadline the key's rate cannot meet: FAILED at Plan, nothing sent, the error names the
  earliest finish.
- many: many shards running, each at its share of the key's rate, and a deadline that lets
  only a few batch; the simulator's batches are late and a cancelled one hands back nothing. The few
  late shards must take the whole key at the cutover and send every line direct in time.

Costs are the summary's estimates from the job's own tokens at list prices (all direct and all
batch are the same tokens priced the other way, so the reference is in the same run).

    .venv/bin/python bench/deadline.py                    # 20,000 lines
    .venv/bin/python bench/deadline.py --lines 2000 --only late
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "functions")]

import orjson  # noqa: E402

WORK = ROOT / ".work"


def write_lines(path: Path, lines: int) -> Path:
    with path.open("wb") as out:
        for n in range(lines):
            body = {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"Review {n}: the kettle is great"}],
            }
            out.write(
                orjson.dumps({"custom_id": f"d-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body})
            )
            out.write(b"\n")
    return path


def answered(sim: Any) -> tuple[Counter[str], Counter[str]]:
    """custom_ids the simulator answered directly, and those its batches' output files returned."""
    from tests.workflow.test_batch import returned_by_batches

    direct = Counter(
        e["custom_id"]
        for e in sim.log
        if e["method"] == "POST" and e["path"] == "/v1/chat/completions" and e["status"] == 200
    )
    return direct, returned_by_batches(sim)


def run_case(
    name: str, args: argparse.Namespace, metadata: dict[str, str], phase_s: float, setup: dict[str, Any]
) -> bool:
    """One case; `setup` overrides the run's shard lines, map concurrency, cancel margin and the
    simulator's settings."""
    from sluice_local.cloud import LocalCloud, LocalSettings, run_job
    from sluice_local.simulator import SimConfig, SimulatorServer

    path = write_lines(WORK / f"deadline-{args.lines}.jsonl", args.lines)
    config = SimConfig(latency_s=args.latency, seed=1).updated(
        {"batch_phase_s": phase_s, "batch_cancel_s": 2.0, **setup.get("sim", {})}
    )
    with SimulatorServer(config) as sim:
        settings = LocalSettings(
            cache="off",
            concurrency=args.concurrency,
            map_concurrency=setup.get("map_concurrency", args.map_concurrency),
            shard_lines=setup.get("shard_lines", args.shard_lines),
            request_timeout_s=30.0,
            batch_cancel_s=setup.get("cancel_s", args.cancel_s),
        )
        cloud = LocalCloud(provider_base_url=sim.base_url, api_key="sk-bench", settings=settings)
        with cloud.running():
            started = time.time()
            run = run_job(cloud, path, metadata=metadata)
            ended = time.time()
        direct, by_batch = answered(sim)
    summary = run.summary
    deadline = summary.get("deadline") or {}
    costs = summary.get("cost_estimate_usd") or {}
    twice = sum(1 for n in (direct + by_batch).values() if n > 1)
    results = len(run.results)
    print(f"\n{name}: {args.lines:,} lines, metadata {metadata}, simulator batch {3 * phase_s:g} s")
    print(f"  status {run.status} in {ended - started:.1f} s; {results:,} results, {len(run.errors):,} errors")
    if name == "refused":
        ok = (
            summary.get("status") == "FAILED"
            and not direct
            and not by_batch
            and "earliest finish" in str(summary.get("error"))
        )
        print(f"  error: {summary.get('error')}")
        print(f"  sent: {sum(direct.values())} direct, {sum(by_batch.values())} by batch -> {'ok' if ok else 'FAIL'}")
        return ok
    at, spare = deadline.get("deadline"), started + float(metadata["sluice-deadline"].rstrip("s")) - ended
    print(
        f"  deadline {at}: {'met' if deadline.get('met') else 'MISSED'} (ended {deadline.get('ended_at')}, "
        f"{spare:.1f} s to spare); cutover {deadline.get('cutover_at')}"
    )
    print(f"  shards: {deadline.get('shards_by_choice')}; lines by path {summary.get('lines_by_path')}")
    print(
        f"  answered: {sum(by_batch.values()):,} by batches, {sum(direct.values()):,} direct; "
        f"custom_ids answered twice: {twice}"
    )
    run_usd, all_direct, all_batch = (
        costs.get("provider"),
        costs.get("provider_all_direct"),
        costs.get("provider_all_batch"),
    )
    ratio = run_usd / all_direct if run_usd is not None and all_direct else float("nan")
    print(f"  provider ${run_usd:.4f} vs all direct ${all_direct:.4f} ({ratio:.3f}x) and all batch ${all_batch:.4f}")
    ok = run.status == "SUCCEEDED" and results == args.lines and twice == 0 and bool(deadline.get("met"))
    if name == "many":
        # every batch late and handing back nothing: a few batch shards among more direct ones, every
        # line sent direct once, so the job costs what all direct does (the price of the promise)
        chosen = deadline.get("shards_by_choice") or {}
        ok = ok and not by_batch and 0 < chosen.get("batch", 0) < chosen.get("direct", 0) and ratio <= 1.0 + 1e-6
    else:
        ok = ok and (ratio < 1.0 if name == "late" else abs(ratio - 0.5) < 1e-3)
    print(f"  -> {'ok' if ok else 'FAIL'}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--shard-lines", type=int, default=2_500)
    parser.add_argument("--map-concurrency", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--rpm", type=int, default=60_000, help="the key's rate the plan holds the deadline at")
    parser.add_argument("--deadline-s", type=float, default=150.0, help="the late case's deadline")
    parser.add_argument("--expect-s", type=float, default=30.0, help="the batch turnaround the late job expects")
    parser.add_argument("--turnaround-s", type=float, default=240.0, help="the simulator's batch turnaround, late case")
    parser.add_argument("--cancel-s", type=float, default=10.0, help="what the plan keeps for a cancel to end")
    parser.add_argument("--many-rpm", type=int, default=12_000, help="the many case's key rate")
    parser.add_argument("--only", choices=("late", "meets", "refused", "many"))
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    cases = {
        "late": (
            {
                "sluice-deadline": f"{args.deadline_s:g}s",
                "sluice-rpm": str(args.rpm),
                "sluice-batch-turnaround": f"{args.expect_s:g}s",
            },
            args.turnaround_s / 3,
            {},
        ),
        "meets": (
            {"sluice-deadline": "600s", "sluice-rpm": str(args.rpm), "sluice-batch-turnaround": "60s"},
            5.0,
            {},
        ),
        "refused": ({"sluice-deadline": "60s", "sluice-rpm": "600"}, 5.0, {}),
        # the 20 shards, 2 h, a 1 h batch, scaled: 20 of 1,000 lines at 12,000 a minute (10 a
        # second a shard, 105 s each), 150 s, a 60 s batch expected, 240 s taken, 12 s for a cancel
        "many": (
            {"sluice-deadline": "150s", "sluice-rpm": str(args.many_rpm), "sluice-batch-turnaround": "60s"},
            80.0,
            {
                "shard_lines": args.lines // 20,
                "map_concurrency": 20,
                "cancel_s": 12.0,
                "sim": {"batch_cancel_answers": "none"},
            },
        ),
    }
    results = {
        name: run_case(name, args, meta, phase, setup)
        for name, (meta, phase, setup) in cases.items()
        if args.only in (None, name)
    }
    print("\n" + ", ".join(f"{name} {'ok' if ok else 'FAIL'}" for name, ok in results.items()))
    sys.exit(0 if all(results.values()) else 1)


if __name__ == "__main__":
    main()
