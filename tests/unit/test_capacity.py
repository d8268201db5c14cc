"""The capacity model: fitted from measured runs, scaled to the documented maximum, held to half of every limit."""

from __future__ import annotations

from typing import Any

import pytest

from bench import capacity, capacity_docs, capacity_model
from bench import capacity_definition as definition
from bench.capacity_runs import prefixes, shape


@pytest.fixture(scope="module")
def model() -> capacity_model.Model:
    return capacity_model.Model.of(capacity.load())


def test_every_figure_at_the_documented_maximum_is_within_half_its_limit(model: capacity_model.Model) -> None:
    over = capacity.over_headroom(model, capacity.environment())
    lines, in_flight, cached = capacity_model.MAXIMUM
    assert not over, (
        f"at {lines:,} lines, {in_flight:,} shards in flight and a {cached:,}-answer cache, "
        f"{len(over)} figures pass half their limit:\n" + "\n".join(f.describe() for f in over)
    )


def test_docs_capacity_md_is_what_the_model_prints(model: capacity_model.Model) -> None:
    expected = capacity_docs.render(capacity.tables(model, capacity.environment()))
    assert capacity.DOCS.read_text() == expected, (
        "docs/capacity.md is stale: run `.venv/bin/python bench/capacity.py docs`"
    )


def test_the_measured_runs_cover_every_mode_and_the_job_steps(model: capacity_model.Model) -> None:
    assert set(model.keys) == set(capacity_model.MODES)
    assert {"plan", "merge", "notify", "mark_failed"} <= set(model.steps)
    assert any(r["job_status"] == "BUDGET_EXCEEDED" for r in model.runs)
    assert max(r["features"]["cached"] for r in model.runs) > 0


# ---- the model on runs made up for the purpose


def made_up_run(lines: int, shards: int, in_flight: int, seconds: float, resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "spec": {"name": f"r{lines}-{shards}", "mode": "direct", "fit": True, "per_shard": 8},
        "features": {
            "lines": lines,
            "shards": shards,
            "runs": shards,
            "shard_seconds": seconds,
            "in_flight": in_flight,
            "cached": 0,
        },
        "resources": resources,
        "calls": {},
        "steps": {},
        "job_status": "SUCCEEDED",
    }


def resource(writes: float, *, spread: int, keys: int, size: int = 100) -> dict[str, Any]:
    entry = {"calls": writes, "write": writes, "read": 0.0, "writes": writes}
    return {"keys": keys, "spread": spread, "size": size, "by": {"shard run_shard UpdateItem": entry}, "windows": {}}


def scenario(lines: int, in_flight: int) -> capacity_model.Scenario:
    return capacity.scenario(capacity.environment(), lines, in_flight, 0, "direct")


def test_a_fit_recovers_what_a_line_a_shard_and_a_second_cost() -> None:
    rows = [[1, 100, 4, 4, 10], [1, 400, 4, 4, 40], [1, 400, 16, 16, 90], [1, 100, 4, 7, 60], [1, 200, 8, 8, 30]]
    truth = [2.0, 0.04, 0.0, 3.0, 0.5]
    ys = [sum(t * x for t, x in zip(truth, row, strict=True)) for row in rows]
    assert capacity_model.nnls(rows, ys) == pytest.approx(truth, abs=1e-6)


def test_a_key_written_from_several_shards_takes_every_shard_in_flight_and_a_shards_own_key_one() -> None:
    def runs(shared: bool) -> list[dict[str, Any]]:
        # half a write a shard-second, on one key all shards write, or on a key each
        return [
            made_up_run(
                120, 4, 4, 12.0, {"ddb-item K X": resource(6.0, spread=4 if shared else 1, keys=1 if shared else 4)}
            ),
            made_up_run(
                480, 16, 8, 96.0, {"ddb-item K X": resource(48.0, spread=16 if shared else 1, keys=1 if shared else 16)}
            ),
        ]

    [shared] = capacity_model.key_classes(runs(True), [])
    [own] = capacity_model.key_classes(runs(False), [])
    assert (shared.scope, own.scope) == ("shared", "shard")
    at = scenario(10_000_000, 1_000)
    shared_rate = {f.name: f.value for f in capacity_model.key_figures(shared, at)}["item K X: WCU/s"]
    own_rate = {f.name: f.value for f in capacity_model.key_figures(own, at)}["item K X: WCU/s"]
    assert shared_rate == pytest.approx(500.0, rel=0.01) and own_rate == pytest.approx(0.5, rel=0.01)


def test_an_item_that_grows_with_the_shards_in_flight_grows_to_the_scenarios_and_costs_its_size() -> None:
    runs = [
        made_up_run(120, 4, 4, 12.0, {"ddb-item L X": resource(6.0, spread=4, keys=1, size=200 + 50 * 4)}),
        made_up_run(480, 16, 8, 96.0, {"ddb-item L X": resource(48.0, spread=8, keys=1, size=200 + 50 * 8)}),
        made_up_run(480, 4, 4, 48.0, {"ddb-item L X": resource(24.0, spread=4, keys=1, size=200 + 50 * 4)}),
    ]
    [item] = capacity_model.key_classes(runs, [])
    found = {f.name: f for f in capacity_model.key_figures(item, scenario(10_000_000, 1_000))}
    assert found["item L X: size"].value == pytest.approx(200 + 50 * 1_000)
    # 500 writes a second, each a unit per KB of the item's 50,200 bytes
    assert found["item L X: WCU/s"].value == pytest.approx(500 * 50, rel=0.01)


def test_keys_are_grouped_by_the_shape_the_code_writes_them_in() -> None:
    job = "reviews-2026-11-0123456789ab"
    assert shape(f"JOB#{job}", job) == "JOB#{job}"
    assert shape("SHARD#00042", job) == "SHARD#{n}"
    assert shape(f"jobs/{job}/shards/00003/part-00001-0002.tsv", job) == "jobs/{job}/shards/{n}/part-{n}-{n}.tsv"
    assert prefixes("jobs/a/b/c.tsv") == ["jobs/", "jobs/a/", "jobs/a/b/"]


def test_every_mode_has_a_loop_counted_from_the_definition() -> None:
    loops = definition.mode_loops()
    assert set(loops) == {"direct", "background", "batch"}
    states = definition.shard_states()
    for loop in loops.values():
        assert loop.events == sum(definition._events(states[s]) for s in loop.states)
        # each state of a loop leads, in the end, back to every other
        assert all(any(n in loop.states for n in definition._successors(states[s])) for s in loop.states)
    assert "RunShard" in loops["direct"].states and "Collect" not in loops["direct"].states
    assert "AwaitWebhooks" in loops["background"].states
