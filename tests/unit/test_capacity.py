"""bench/capacity.py: exact counts by cause, rates from the settings, and the defects it must catch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sluice.contract import causes
from sluice.limits.lease import LeasePolicy, lease_period_s
from sluice.shard.parts import PartWriter
from sluice.store.keys import job_key

from bench import capacity
from bench.scale import account, counts, figures, memory, rates, runs


@pytest.fixture(scope="module")
def counted() -> list[dict[str, Any]]:
    return capacity.load()


@pytest.mark.slow
def test_docs_capacity_md_is_what_the_counts_give(counted: list[dict[str, Any]]) -> None:
    assert capacity.DOCS.read_text() == capacity.docs(counted), "run `.venv/bin/python bench/capacity.py docs`"


@pytest.mark.slow
def test_the_recorded_counts_are_exact_and_every_figure_at_the_maximum_is_within_half(
    counted: list[dict[str, Any]],
) -> None:
    text, ok = capacity.report(counted)
    assert ok, text
    # nothing waits for a design change: every figure is within half its limit
    assert capacity.OPEN == {}
    assert {run["variant"] for run in counted} == {v.name for v in runs.VARIANTS}


def test_every_figure_says_how_it_is_known_and_the_counted_ones_by_cause(counted: list[dict[str, Any]]) -> None:
    found = figures.all_figures(counted, rates.maximum)
    assert {f.known for f in found} == {"counted", "measured", "definition"}
    counted_figures = [f for f in found if f.known == "counted"]
    assert counted_figures and all(f.parts for f in counted_figures)
    assert all(name in counts.BY_NAME for f in counted_figures for name, _ in f.parts)


def _run(variant: str, lines: int, *targets: dict[str, Any], occurrences: dict[str, int], periods: Any = None) -> Any:
    return {
        "variant": variant,
        "lines": lines,
        "shards": lines // 30,
        "occurrences": occurrences,
        "periods": periods or {name: [[None, None]] for name in occurrences},
        "targets": list(targets),
        "undeclared": [],
    }


def _target(cause: str, calls: int, units: float = 1.0, shape: str = "t:JOB#{job}|META", keys: int = 1) -> Any:
    return {
        "cause": cause,
        "service": "dynamodb",
        "operation": "UpdateItem",
        "shape": shape,
        "calls": calls,
        "read_units": 0.0,
        "write_units": units * calls,
        "keys": [f"k{i}" for i in range(keys)],
        "item_bytes": 600,
    }


def test_a_ratio_that_moves_with_the_runs_size_is_a_problem_and_one_that_holds_is_not() -> None:
    run = causes.RUN.name
    exact = [
        _run("v", 60, _target(run, 2), occurrences={run: 2}),
        _run("v", 120, _target(run, 4), occurrences={run: 4}),
    ]
    assert counts.problems(exact) == []
    moved = [
        _run("v", 60, _target(run, 2), occurrences={run: 2}),
        _run("v", 120, _target(run, 6), occurrences={run: 4}),
    ]
    [problem] = counts.problems(moved)
    assert "a shard's run" in problem and "1 calls" in problem and "3/2 calls" in problem


def test_a_call_under_no_cause_and_a_period_nobody_declared_are_problems() -> None:
    part = causes.PART.name
    one = _run("v", 60, _target(part, 2), occurrences={part: 2})
    one["undeclared"] = [["run_shard", "dynamodb", "UpdateItem", "t:JOB#{job}|META", 3]]
    problems = counts.problems([one, _run("v", 120, _target(part, 4), occurrences={part: 4})])
    assert any("under no cause" in p for p in problems)
    assert any("time-driven" in p and part in p for p in problems)


def test_a_lost_race_is_counted_but_never_compared() -> None:
    race = causes.RACE.name
    runs_ = [
        _run("v", 60, _target(race, 2), occurrences={race: 1}),
        _run("v", 120, _target(race, 9), occurrences={race: 2}),
    ]
    assert counts.problems(runs_) == []


def test_a_lease_of_1000_lessees_lasts_long_enough_for_the_item_and_the_rate_says_so() -> None:
    s = rates.maximum("direct")
    policy = LeasePolicy()
    assert lease_period_s(policy, 1_000, s.shard_rate) == 1_000 / policy.item_leases_per_s
    lease = rates.rate(causes.LEASE_TAKEN, s, service="dynamodb", per_line=0, period_s=2.0, every=25)
    assert lease is not None and lease.job == pytest.approx(policy.item_leases_per_s)
    # up to 80 lessees the 2 s minimum holds
    assert lease_period_s(policy, 80, s.shard_rate) == pytest.approx(2.0)


def test_a_budget_chunk_doubles_to_its_period_so_1000_shards_write_the_job_row_under_half() -> None:
    s = rates.maximum("direct")
    chunk = rates.rate(causes.BUDGET_CHUNK, s, service="dynamodb", per_line=0, period_s=5.0, every=50)
    assert chunk is not None
    assert chunk.job < 0.5 * figures.DDB_PARTITION_WCU_PER_S
    # at 50 requests a chunk, as before the doubling, it was 633 a second
    assert s.active * s.shard_rate / 50 > 600


def test_a_kilobyte_a_line_held_by_plan_is_a_memory_figure_over_half(tmp_path: Path) -> None:
    planted = [
        memory.Measure("plan", lines, 0, peak_mb=50 + lines * 1024 / 2**20, cpu_s=lines / 200_000)
        for lines in (10_000, 100_000, 1_000_000)
    ]
    record = tmp_path / "memory.json"
    memory.save(record, planted, {})
    [peak] = [f for f in figures.memory_figures(record) if f.name.startswith("plan peak")]
    assert peak.over and peak.value > 9_000


@pytest.mark.cloud
@pytest.mark.slow
def test_a_planted_write_a_line_to_the_jobs_row_puts_it_over_half(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same runs as the check's, with every outcome also adding to the job's row: the check fails
    on the job row's figure, whatever cause the planted write runs under."""
    add_outcome = PartWriter.add_outcome

    def planted(self: PartWriter, *args: Any, **kwargs: Any) -> None:
        spec = self._spec
        self._store.table.update_item(Key=job_key(spec.job_id), UpdateExpression="SET expires_at = expires_at")
        add_outcome(self, *args, **kwargs)

    monkeypatch.setattr(PartWriter, "add_outcome", planted)
    found = runs.count_variant("direct")
    row = [
        f
        for f in figures.key_figures("direct", found, rates.maximum("direct"))
        if "|META" in f.name and "WCU" in f.name
    ]
    assert row and all(f.over for f in row), "\n".join(f.line() for f in row)
    text, ok = capacity.report(found + [r for r in capacity.load() if r["variant"] != "direct"])
    assert not ok and "OVER" in text


def test_the_stated_scenario_names_its_key_its_jobs_and_its_batch_shards() -> None:
    lines = account.scenario_lines()
    assert all(f"{account.JOBS_AT_ONCE} jobs at once" in line for line in lines)
    assert "30,000 RPM" in lines[0] and account.KEY in lines[0]
    assert "1,000 shards in flight" in lines[2]
    direct = account.stated("direct")
    # the jobs share the key: together they settle its rate, not Plan's per-shard cap times the shards
    assert direct.line_rate == pytest.approx(30_000 / 60)


def test_every_account_figure_says_its_causes(counted: list[dict[str, Any]]) -> None:
    found = account.account_figures(counted)
    kinds = {f.name.split(",")[0] for f in found}
    assert {"the jobs table", "Lambda concurrency", "open Map Runs"} <= kinds
    assert any(f.name.startswith("Step Functions state transitions") for f in found)
    assert any(f.name.startswith("the webhook API's requests") for f in found)
    assert any(f.name.startswith("Bedrock batch inference jobs a model") for f in found)
    assert all(f.parts for f in found if not f.name.startswith("open Map Runs"))


def _index_write_a_line(counted: list[dict[str, Any]], variant: str) -> list[dict[str, Any]]:
    """The runs as recorded, but every line also writing the provider-id index once."""
    planted = []
    for run in counted:
        run = {**run, "targets": list(run["targets"])}
        if run["variant"] == variant:
            run["targets"].append(
                {
                    **_target(causes.LINE.name, run["lines"], shape="sluice-local-jobs:resp_{n}| (by_provider_id)"),
                    "operation": "BatchWriteItem",
                    "keys": [f"resp_{i}" for i in range(run["lines"])],
                }
            )
            run["occurrences"] = {**run["occurrences"], causes.LINE.name: max(1, run["occurrences"][causes.LINE.name])}
        planted.append(run)
    return planted


@pytest.mark.slow
def test_a_planted_index_write_a_line_fails_the_check_at_the_line_rate(
    counted: list[dict[str, Any]],
) -> None:
    """No line writes an index entry of its own: a write a line planted there is counted on the
    index, by its cause, at the jobs' line rate over the occurrences the runs saw; in batch mode,
    whose 1,000 shards settle lines fastest, that is over half the index's warm throughput and the
    check fails (the index is not pre-warmed, so the table's warm throughput does not hide it)."""
    variant = "batch"

    def index_wcu(runs_: list[dict[str, Any]]) -> float:
        return sum(
            f.value
            for f in account.account_figures(runs_)
            if f.variant == variant and "index by_provider_id, WCU/s against the table-level" in f.name
        )

    planted_runs = _index_write_a_line(counted, variant)
    line_rate = account.stated("batch").line_rate
    assert index_wcu(planted_runs) - index_wcu(counted) >= line_rate
    text, ok = capacity.report(planted_runs)
    assert not ok
    over = [line for line in text.splitlines() if line.startswith("OVER")]
    assert any("index by_provider_id, WCU/s against a new table's warm throughput" in line for line in over), text
    assert "a line settled" in text
    _, still_ok = capacity.report(counted)
    assert still_ok
