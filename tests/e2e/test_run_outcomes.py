"""`sluice run` in every mode on the README's example."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from sluice.verify import verify

from tests.e2e.test_cli import ROOT, clean_env, sluice

EXAMPLE = ROOT / "examples" / "reviews.jsonl"


@pytest.mark.parametrize("mode", ["direct", "background", "batch", "auto"])
def test_the_example_runs_in_every_mode_with_no_errors_in_input_order(mode: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = sluice(
        "run", str(EXAMPLE), "--out", str(out), "--mode", mode, "--latency", "0.01", "--quiet", env=clean_env()
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert "SUCCEEDED" in done.stderr and "0 errors" in done.stderr
    inputs = EXAMPLE.read_bytes().splitlines(keepends=True)
    results = (out / "reviews.results.jsonl").read_bytes().splitlines()
    errors = (out / "reviews.errors.jsonl").read_bytes().splitlines()
    summary = orjson.loads((out / "reviews.summary.json").read_bytes())
    assert errors == [] and len(results) == len(inputs)
    assert [orjson.loads(r)["custom_id"] for r in results] == [orjson.loads(line)["custom_id"] for line in inputs]
    assert verify(inputs, results, errors, summary).ok
    paths = summary["lines_by_path"]
    assert sum(paths.values()) == len(inputs)
    if mode == "background":
        # the example is half chat completions, which have no background form
        assert paths == {"background": 1000, "direct": 1000}
    if mode == "batch":
        assert paths == {"batch": 2000}
