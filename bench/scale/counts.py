"""Calls per occurrence of each cause, and what makes them not exact.

A cause's calls per occurrence (per target and operation, with their units) must come out the
same at both sizes of a variant: a ratio that moves with the run's size means a call is counted
under a cause that does not trigger it, and the scaled figure would be wrong. A step's call with
no cause, and a time-driven cause (`Per.PERIOD`, `PART`, `LEASE`, `POLL`) whose occurrences do not
say their period, make the check fail too.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from sluice.contract import causes

from bench.scale.runs import WORKFLOW_CAUSE

# what a run meets by chance (a race lost, a shared item made): counted, never compared, and
# bounded on paper in docs/capacity.md
CONTINGENT = frozenset({causes.Per.RACE, causes.Per.ONCE})
TIMED = frozenset({causes.Per.PERIOD, causes.Per.PART, causes.Per.LEASE, causes.Per.POLL})
# the bench's own cause for the state machine's reads, which no Lambda code declares
WORKFLOW = causes.Cause(WORKFLOW_CAUSE, causes.Per.JOB)
BY_NAME = {c.name: c for c in (*causes.CAUSES, WORKFLOW)}


@dataclass(frozen=True)
class PerOccurrence:
    """One cause's calls to one target, per occurrence of the cause."""

    cause: str
    service: str
    operation: str
    shape: str
    calls: Fraction
    read_units: Fraction
    write_units: Fraction
    # how many of this shape the run touched, per shard it ran: 1/shards for one shared item
    distinct_per_shard: Fraction
    item_bytes: int


def _ratio(value: float, occurrences: int) -> Fraction:
    return Fraction(value).limit_denominator(10_000) / occurrences


def per_occurrence(run: dict[str, Any]) -> dict[tuple[str, str, str, str], PerOccurrence]:
    found = {}
    for t in run["targets"]:
        occurrences = run["occurrences"].get(t["cause"], 0)
        key = (t["cause"], t["service"], t["operation"], t["shape"])
        if occurrences == 0:
            continue
        found[key] = PerOccurrence(
            *key,
            calls=Fraction(t["calls"], occurrences),
            read_units=_ratio(t["read_units"], occurrences),
            write_units=_ratio(t["write_units"], occurrences),
            distinct_per_shard=Fraction(len(t["keys"]), run["shards"]),
            item_bytes=t["item_bytes"],
        )
    return found


def problems(runs: list[dict[str, Any]]) -> list[str]:
    """What keeps the counts from being exact; empty when every ratio holds at both sizes."""
    found: list[str] = []
    by_variant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        by_variant[run["variant"]].append(run)
        where = f"{run['variant']} at {run['lines']} lines"
        for step, service, operation, shape, n in run["undeclared"]:
            found.append(f"{where}: {n} {service} {operation} on {shape or '-'} by {step} under no cause")
        for t in run["targets"]:
            if t["cause"] not in BY_NAME:
                found.append(f"{where}: cause {t['cause']!r} is not declared in sluice.contract.causes")
            elif run["occurrences"].get(t["cause"], 0) == 0 and BY_NAME[t["cause"]].per not in CONTINGENT:
                found.append(f"{where}: {t['calls']} calls under {t['cause']!r}, which never occurred")
        for cause, periods in run["periods"].items():
            if cause in BY_NAME and BY_NAME[cause].per in TIMED and any(p is None for p, _ in periods):
                found.append(f"{where}: {cause!r} is time-driven and an occurrence gave no period")
    for variant, sized in by_variant.items():
        if not all(run.get("compared", True) for run in sized):
            # a path whose polls depend on timing: counted, bounded on paper (`paper.py`)
            continue
        small, large = sorted(sized, key=lambda r: r["lines"])[:2]
        a, b = per_occurrence(small), per_occurrence(large)
        for key in sorted(set(a) | set(b)):
            x, y = a.get(key), b.get(key)
            if BY_NAME.get(key[0]) is not None and BY_NAME[key[0]].per in CONTINGENT:
                continue
            if (x is None or y is None) and not all(r["occurrences"].get(key[0], 0) > 0 for r in (small, large)):
                # a cause one size did not meet: its calls per occurrence are the other size's
                continue
            if x is None or y is None:
                cause, service, operation, shape = key
                seen = "the larger" if x is None else "the smaller"
                found.append(f"{variant}: {cause!r} calls {service} {operation} on {shape} only in {seen} run")
                continue
            if (x.calls, x.read_units, x.write_units) != (y.calls, y.read_units, y.write_units):
                found.append(
                    f"{variant}: {key[0]!r} {key[1]} {key[2]} on {key[3]}: "
                    f"{_show(x)} at {small['lines']} lines, {_show(y)} at {large['lines']}"
                )
    return found


def _show(p: PerOccurrence) -> str:
    return f"{p.calls} calls ({p.read_units} RU, {p.write_units} WU) an occurrence"
