"""The spending cap: a job stops within one request's cost of its cap, and a retry with a
higher budget finishes it, sending no line twice.

The local cloud (moto, in-process Lambdas, IAM enforced) runs a job of --lines chat completions
in shards of --shard-lines against the simulator, first with no cap (its cost is the reference),
then with a cap of --fraction of that cost, then the lines the cap left unsent as a retry job
(as `sluice retry JOB --budget USD` builds it) with a cap of twice the full cost. Figures:

  cap, spent (what the shards counted against the cap, at list prices) and the gap between
  them in units of one request's worst case (the cost the budget reserves before sending) and
  of one answer's average cost; lines answered and lines unfinished (errors `budget_exceeded`);
  the job row writes the budget made per line sent; then the retry's figures, and how many
  lines the provider saw twice across the two capped runs.

    .venv/bin/python bench/budget.py --lines 2000 --shard-lines 250 --fraction 0.5
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

import orjson  # noqa: E402
from sluice.contract.model import Request  # noqa: E402
from sluice.formats.lines import parse_line  # noqa: E402
from sluice.limits.budget import worst_case_nano  # noqa: E402
from sluice.providers import OPENAI  # noqa: E402
from sluice.store.jobs import JobStore  # noqa: E402

from sluice_local.cloud import JobRun, LocalCloud, LocalSettings, run_job  # noqa: E402
from sluice_local.deployed.retry import INPUT_ERROR_CODES, write_lines  # noqa: E402
from sluice_local.simulator import SimConfig, SimulatorServer  # noqa: E402

WORK = ROOT / ".work"


def make_input(path: Path, lines: int, max_tokens: int) -> None:
    with path.open("wb") as out:
        for n in range(lines):
            body = {
                "model": "gpt-4o-mini",
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": f"Write a short note about item {n} of the catalogue."}],
            }
            row = {"custom_id": f"b-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            out.write(orjson.dumps(row) + b"\n")


class WriteCounter:
    """Counts the budget's calls on the job row (the local cloud runs the shards in this process)."""

    def __init__(self) -> None:
        self.writes = 0
        self.reads = 0
        self._originals: dict[str, Callable[..., Any]] = {}

    def __enter__(self) -> WriteCounter:
        for name, kind in (("reserve_budget", "writes"), ("release_budget", "writes"), ("budget_state", "reads")):
            original = getattr(JobStore, name)
            self._originals[name] = original

            def counted(*args: Any, _original: Any = original, _kind: str = kind, **kwargs: Any) -> Any:
                setattr(self, _kind, getattr(self, _kind) + 1)
                return _original(*args, **kwargs)

            setattr(JobStore, name, counted)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, original in self._originals.items():
            setattr(JobStore, name, original)

    def take(self) -> tuple[int, int]:
        figures = (self.writes, self.reads)
        self.writes = self.reads = 0
        return figures


def one_request_usd(path: Path) -> float:
    """The largest worst case among the input's requests: what the budget reserves for one."""
    worst = 0
    for number, raw in enumerate(path.read_bytes().splitlines(keepends=True), start=1):
        parsed = parse_line(raw, number)
        if isinstance(parsed, Request):
            worst = max(worst, worst_case_nano(parsed, OPENAI))
    return worst / 1e9


def describe(
    label: str, run: JobRun, cap: float, one: float, answer: float, wall: float, calls: tuple[int, int]
) -> None:
    budget = run.summary.get("budget", {})
    spent = float(budget.get("spent_usd", 0.0))
    gap = cap - spent
    answered = len(run.results)
    unfinished = sum(1 for e in run.errors if e["error"]["code"] == "budget_exceeded")
    writes, reads = calls
    print(
        f"{label:8} {run.summary['status']:16} cap ${cap:.6f}  spent ${spent:.6f}  "
        f"{'under' if gap >= 0 else 'over'} the cap by ${abs(gap):.6f} = {abs(gap) / one:.2f} request worst cases "
        f"= {abs(gap) / answer:.1f} average answers",
        flush=True,
    )
    print(
        f"         {answered:,} lines answered, {unfinished:,} unfinished, "
        f"{len(run.errors) - unfinished} other errors; "
        f"{writes} job-row writes = {writes / max(1, answered):.3f} per line sent, {reads} reads; {wall:.1f} s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--shard-lines", type=int, default=250)
    parser.add_argument("--map-concurrency", type=int, default=8, help="shards at a time")
    parser.add_argument("--concurrency", type=int, default=400, help="requests in flight for the job")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per answer")
    parser.add_argument("--max-tokens", type=int, default=40, help="each request's output cap")
    parser.add_argument("--fraction", type=float, default=0.5, help="the cap as a share of the job's full cost")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"budget-{args.lines}.jsonl"
    make_input(path, args.lines, args.max_tokens)
    one = one_request_usd(path)
    settings = LocalSettings(
        # every run asks the provider: a cache filled by an earlier run would answer it instead
        cache="off",
        concurrency=args.concurrency,
        map_concurrency=args.map_concurrency,
        shard_lines=args.shard_lines,
        request_timeout_s=30.0,
    )
    print(
        f"{args.lines:,} lines in shards of {args.shard_lines}, {args.map_concurrency} at a time, concurrency "
        f"{args.concurrency}, latency {args.latency} s; one request's worst case ${one:.8f} (max_tokens "
        f"{args.max_tokens}, gpt-4o-mini list price)",
        flush=True,
    )
    with SimulatorServer(SimConfig(latency_s=args.latency)) as sim, WriteCounter() as counter:
        cloud = LocalCloud(provider_base_url=sim.base_url, api_key="sk-bench-budget", settings=settings)
        with cloud.running():
            started = time.monotonic()
            full = run_job(cloud, path, key="inbox/budget-uncapped.jsonl")
            cost = float(full.summary["cost_estimate_usd"]["provider"])
            answer = cost / max(1, len(full.results))
            print(
                f"no cap   {full.summary['status']:16} {len(full.results):,} answered, cost ${cost:.6f} "
                f"(${answer:.8f} an answer on average); {time.monotonic() - started:.1f} s",
                flush=True,
            )
            sim.clear_log()
            counter.take()

            cap = round(cost * args.fraction, 9)
            started = time.monotonic()
            capped = run_job(cloud, path, metadata={"sluice-budget-usd": str(cap)})
            describe("capped", capped, cap, one, answer, time.monotonic() - started, counter.take())

            picked = {e["line"]: e["custom_id"] for e in capped.errors if e["error"]["code"] not in INPUT_ERROR_CODES}
            retry_path = WORK / f"budget-{args.lines}.retry-1.jsonl"
            write_lines(iter([path.read_bytes()]), picked, retry_path)
            resume_cap = round(cost * 2, 9)
            started = time.monotonic()
            resumed = run_job(
                cloud,
                retry_path,
                key="inbox/budget.retry-1.jsonl",
                metadata={"sluice-budget-usd": str(resume_cap), "sluice-parent-job": capped.job_id},
            )
            describe("resume", resumed, resume_cap, one, answer, time.monotonic() - started, counter.take())
        sent = Counter(e["custom_id"] for e in sim.log if e["method"] == "POST" and e["custom_id"])
    answered = {r["custom_id"] for r in capped.results} | {r["custom_id"] for r in resumed.results}
    twice = sum(1 for n in sent.values() if n > 1)
    print(
        f"together: {len(answered):,}/{args.lines:,} lines answered, {twice} sent twice, "
        f"spent ${float(capped.summary['budget']['spent_usd']) + float(resumed.summary['budget']['spent_usd']):.6f} "
        f"(uncapped: ${cost:.6f})",
        flush=True,
    )
    path.unlink()
    retry_path.unlink()


if __name__ == "__main__":
    main()
