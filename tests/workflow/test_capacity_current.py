"""bench/capacity.json is current: a fresh run writes the keys and prefixes it records, from the same callers."""

from __future__ import annotations

from typing import Any

from bench import capacity, capacity_runs


def written(run: dict[str, Any]) -> dict[str, set[str]]:
    """Each DynamoDB key class and S3 prefix (to the job's level) the run wrote, with who wrote it."""
    return {
        name: {caller for caller, entry in resource["by"].items() if entry.get("write")}
        for name, resource in run["resources"].items()
        if (name.startswith("ddb-") or name.count("/") <= 2) and any(e.get("write") for e in resource["by"].values())
    }


def test_a_fresh_run_writes_what_the_measured_runs_record() -> None:
    recorded = {run["spec"]["name"]: run for run in capacity.load()["runs"]}
    spec = next(r for r in capacity_runs.RUNS if r.name == "direct")

    [fresh] = capacity_runs.measure((spec,), trace_memory=False)

    assert fresh["job_status"] == "SUCCEEDED"
    assert written(fresh) == written(recorded["direct"]), (
        "the code writes other keys than bench/capacity.json records: run `.venv/bin/python bench/capacity.py measure`"
    )
