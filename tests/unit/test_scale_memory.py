from __future__ import annotations

from pathlib import Path

import pytest

from bench.scale import memory

SIZES = (10_000, 100_000, 1_000_000)


def measures(step: str, mb_per_line: float, *, base: float = 60.0, noise: float = 0.0) -> list[memory.Measure]:
    return [
        memory.Measure(step, lines, 0, base + mb_per_line * lines + noise * (-1) ** n, 1e-5 * lines)
        for n, lines in enumerate(SIZES)
    ]


def test_a_straight_line_is_its_own_upper_bound() -> None:
    (f,) = memory.fit(measures("plan", 2e-5))
    assert f.slope_mb_per_line == pytest.approx(2e-5)
    assert f.intercept == pytest.approx(60.0)
    assert f.upper_mb_at(10_000_000) == pytest.approx(260.0)
    assert f.upper_cpu_at(10_000_000) == pytest.approx(100.0)


def test_scatter_about_the_line_raises_the_bound_by_three_standard_errors() -> None:
    (f,) = memory.fit(measures("plan", 2e-5, noise=5.0))
    predicted = f.slope_mb_per_line * 10_000_000 + f.intercept
    assert f.upper_mb_at(10_000_000) > predicted + 3 * 5.0
    # never below what was measured, even where the line bends down
    (flat,) = memory.fit(measures("merge", -1e-5, base=200.0))
    assert flat.upper_mb_at(10_000_000) == pytest.approx(max(m.peak_mb for m in flat.points))


def test_a_kilobyte_a_line_puts_plan_over_half_its_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lean = measures("plan", 2e-5)
    fat = [memory.Measure("plan", m.lines, 100_000_000, m.peak_mb + m.lines * 1000 / 2**20, m.cpu_s) for m in lean]
    fits = {f.cache: f for f in memory.fit(lean + fat)}
    assert fits[0].upper_mb_at(10_000_000) < 3008 / 2
    assert fits[100_000_000].upper_mb_at(10_000_000) > 3008 / 2
    assert memory.verdict(fits[0]) and not memory.verdict(fits[100_000_000])
    record = tmp_path / "memory.json"
    memory.save(record, lean + fat, {})
    memory.main(["show", "--out", str(record)])
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["empty"].endswith("ok")
    assert rows["100,000,000"].endswith("OVER")


def test_a_long_plan_is_held_to_the_timeout() -> None:
    slow = [memory.Measure("plan", m.lines, 0, m.peak_mb, 1e-4 * m.lines) for m in measures("plan", 2e-5)]
    (f,) = memory.fit(slow)
    assert f.upper_cpu_at(10_000_000) == pytest.approx(1000.0)
    assert not memory.verdict(f)


@pytest.fixture
def small_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a job of 30,000 lines in place of the big cache's million: what the tests plan is its first lines
    monkeypatch.setattr(memory, "WORK", tmp_path)
    monkeypatch.setattr(memory, "CACHE_JOB_LINES", 30_000)


@pytest.mark.subprocess
@pytest.mark.usefixtures("small_job")
@pytest.mark.slow
def test_plan_measured_in_a_child_has_a_peak() -> None:
    m = memory.measure("plan", 10_000, 0)
    assert (m.step, m.lines, m.cache) == ("plan", 10_000, 0)
    assert m.peak_mb >= m.baseline_mb > 0
    assert m.cpu_s > 0


@pytest.mark.subprocess
@pytest.mark.usefixtures("small_job")
@pytest.mark.slow
def test_a_planted_kilobyte_a_line_is_over() -> None:
    planted = [memory.measure("plan", lines, 0, plant_bytes=1000) for lines in (10_000, 30_000)]
    (f,) = memory.fit(planted)
    assert f.slope_mb_per_line > 1000 / 2**20
    assert f.upper_mb_at(10_000_000) > 3008 / 2
    assert not memory.verdict(f)


@pytest.mark.subprocess
@pytest.mark.parametrize("step", ["merge", "mark_failed"])
@pytest.mark.slow
def test_merge_and_mark_failed_measured_in_a_child_beside_the_file_backed_moto(step: str) -> None:
    m = memory.measure(step, 10_000)
    assert (m.step, m.lines) == (step, 10_000)
    assert m.peak_mb >= m.baseline_mb > 0


def test_the_record_measures_every_step_at_the_size_its_verdict_is_given_for() -> None:
    """`show` holds a fit's upper bound at TARGET_LINES to half the limit: a bound that rests on a
    measured point there, not on a line drawn through smaller jobs."""
    measured: dict[tuple[str, int], set[int]] = {}
    for m in memory.load(memory.RECORD):
        measured.setdefault((m.step, m.cache), set()).add(m.lines)
    assert {step for step, _ in measured} == set(memory.STEPS)
    for (step, cache), sizes in measured.items():
        assert memory.TARGET_LINES in sizes, (
            f"{step} (cache {cache:,}) is not measured at {memory.TARGET_LINES:,} lines"
        )
