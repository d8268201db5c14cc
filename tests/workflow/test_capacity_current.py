"""bench/scale/counts.json is current: a fresh count of a variant gives the ratios it records."""

from __future__ import annotations

from bench import capacity
from bench.scale import counts, runs


def test_a_fresh_count_gives_the_calls_per_occurrence_the_record_holds() -> None:
    fresh = runs.count_variant("direct")
    recorded = [r for r in capacity.load() if r["variant"] == "direct"]
    assert counts.problems(fresh) == []
    for new, old in zip(
        sorted(fresh, key=lambda r: r["lines"]), sorted(recorded, key=lambda r: r["lines"]), strict=True
    ):
        exact = {
            k: v for k, v in counts.per_occurrence(new).items() if counts.BY_NAME[k[0]].per not in counts.CONTINGENT
        }
        held = {
            k: v for k, v in counts.per_occurrence(old).items() if counts.BY_NAME[k[0]].per not in counts.CONTINGENT
        }
        assert {k: (v.calls, v.write_units, v.read_units) for k, v in exact.items()} == {
            k: (v.calls, v.write_units, v.read_units) for k, v in held.items()
        }, "the code calls AWS otherwise than bench/scale/counts.json records: run `bench/capacity.py count`"
