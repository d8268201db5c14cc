"""What Sluice asks of AWS: one job at 10,000,000 lines, 1,000 shards in flight and 10^8 cached
answers, and the account with several jobs at once at a stated scenario (`bench/scale/account.py`).

    .venv/bin/python bench/capacity.py count     # the runs (about a minute); rewrites bench/scale/counts.json
    .venv/bin/python bench/capacity.py check     # the runs again, then every figure; exit 1 on any problem
    .venv/bin/python bench/capacity.py           # the figures, from bench/scale/counts.json
    .venv/bin/python bench/capacity.py docs      # rewrites docs/capacity.md from bench/scale/counts.json

How each figure is made is in bench/scale/README.md: calls counted by cause in small local runs
(`bench/scale/runs.py`, `counts.py`), each cause's rate at the scenario from the settings and the
code's periods (`rates.py`), their product on each item, partition key and prefix (`figures.py`);
memory measured as resident size (`memory.py`); what cannot be counted bounded on paper (`paper.py`).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]
# jsii (under infra's CDK imports) prints a banner on every start under Node 20
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from bench.scale import account, counts, figures, paper, rates, runs  # noqa: E402

COUNTED = Path(os.environ.get("SLUICE_CAPACITY_COUNTS", ROOT / "bench" / "scale" / "counts.json"))
DOCS = ROOT / "docs" / "capacity.md"
# figures over half their limit that wait for a design change (`name [variant]`), each with the
# change it waits for
OPEN: dict[str, str] = {}


def load(path: Path = COUNTED) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = orjson.loads(path.read_bytes())
    return data


def count(log: Any = None) -> list[dict[str, Any]]:
    return [c.as_json() for c in runs.count_all(log=log)]


def report(counted: list[dict[str, Any]]) -> tuple[str, bool]:
    """The check's whole output, and whether it passes: no problem in the counts, no figure or
    bound over half its limit that is not open."""
    out = io.StringIO()
    problems = counts.problems(counted)
    found = figures.all_figures(counted, rates.maximum)
    bounded = paper.bounds(rates.maximum("direct"))
    s = rates.maximum("direct")
    print(
        "One item, partition or prefix, held to one job at its most concentrated (a bound, not a key anyone "
        f"holds): {s.label()}; a shard settles {s.shard_rate:.3g} lines a second (Plan's cap), ",
        file=out,
        end="",
    )
    print(f"the job {s.line_rate:,.0f} (as if its key gave {s.key_rpm:,.0f} RPM); poll {s.poll_s:g} s\n", file=out)
    print("Counts that are not exact:" if problems else "Counts: every ratio the same at both sizes", file=out)
    for problem in problems:
        print(f"  {problem}", file=out)
    print(file=out)
    for figure in sorted(found, key=lambda f: (-f.share, f.name, f.variant)):
        print(figure.line(), file=out)
    print(file=out)
    for bound in bounded:
        print(bound.line(), file=out)
    print("\nThe account, every job at once, at the stated scenario:", file=out)
    for line in account.scenario_lines():
        print(f"  {line}", file=out)
    print(file=out)
    whole = account.account_figures(counted)
    for figure in sorted(whole, key=lambda f: (-f.share, f.name, f.variant)):
        print(figure.line(), file=out)
    found = found + whole
    over = [f"{f.name} [{f.variant}]" for f in found if f.over and f"{f.name} [{f.variant}]" not in OPEN]
    over += [b.name for b in bounded if b.over]
    print(f"\nover half their limit: {len(over)}; open: {len(OPEN)}", file=out)
    for name, change in OPEN.items():
        print(f"  open: {name}: waits for {change}", file=out)
    return out.getvalue(), not problems and not over


def per_cause_table(counted: list[dict[str, Any]]) -> str:
    """Calls per occurrence of each cause, variant by variant, from the larger run."""
    rows = [
        "| variant | cause (per) | call | target | calls an occurrence | WCU | RCU |",
        "|---|---|---|---|---|---|---|",
    ]
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for run in counted:
        by_variant.setdefault(run["variant"], []).append(run)
    for variant, sized in by_variant.items():
        small, large = sorted(sized, key=lambda r: r["lines"])[:2]
        merged = {**counts.per_occurrence(small), **counts.per_occurrence(large)}
        for (cause, service, operation, shape), p in sorted(merged.items()):
            per = counts.BY_NAME[cause].per.value if cause in counts.BY_NAME else "?"
            rows.append(
                f"| {variant} | {cause} ({per}) | {service} {operation} | `{shape}` | {p.calls} | "
                f"{p.write_units} | {p.read_units} |"
            )
    return "\n".join(rows)


def _verdict(ok: bool) -> str:
    if not ok:
        return "figures over half their limit"
    if OPEN:
        return f"every figure within half its limit but {len(OPEN)} open, each with the change it waits for"
    return "every figure within half its limit"


def docs(counted: list[dict[str, Any]]) -> str:
    text, ok = report(counted)
    readme = (ROOT / "bench" / "scale" / "README.md").read_text()
    return (
        "# Capacity at the documented maximum\n\n"
        "Generated by `.venv/bin/python bench/capacity.py docs` from `bench/scale/counts.json` and "
        "`bench/scale/memory.json`; `tests/unit/test_capacity.py` fails when it is not what they give. "
        "Each figure says how it is known: **counted** (calls per cause counted in local runs, times each "
        "cause's rate derived from the settings), **measured** (a step's peak resident size and CPU in a "
        "process of its own), **definition** (from the state machine's definition and Merge's planner), "
        "or **bounded on paper** (with the assumption it rests on).\n\n"
        f"Verdict: {_verdict(ok)}.\n\n"
        "```\n" + text + "```\n\n"
        "## Calls per occurrence, by cause\n\n" + per_cause_table(counted) + "\n\n"
        "## How the figures are made\n\n" + readme.split("\n", 2)[2]
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="report", choices=("count", "check", "report", "docs"))
    args = parser.parse_args(argv)
    if args.command == "count":
        counted = count(log=lambda m: print(m, file=sys.stderr))
        COUNTED.write_bytes(orjson.dumps(counted, option=orjson.OPT_INDENT_2) + b"\n")
        problems = counts.problems(counted)
        print("\n".join(problems) or "every ratio the same at both sizes")
        raise SystemExit(1 if problems else 0)
    if args.command == "docs":
        DOCS.write_text(docs(load()))
        return
    counted = count() if args.command == "check" else load()
    text, ok = report(counted)
    print(text, end="")
    if args.command == "check" and not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
