"""examples/make_reviews.py: the README's bigger files are made of distinct requests."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _make_reviews() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_reviews", ROOT / "examples" / "make_reviews.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bodies(rows: list[dict[str, object]]) -> set[str]:
    return {json.dumps(row["body"], sort_keys=True) for row in rows}


@pytest.mark.slow
def test_every_request_is_distinct_at_any_size_and_a_seed_repeats_its_file() -> None:
    build = _make_reviews().build
    big = build(20_000, seed=1)
    assert len(_bodies(big)) == 20_000
    assert build(20_000, seed=1) == big
    # another seed shares no request with the first: its run is not answered from the cache
    assert not _bodies(build(20_000, seed=2)) & _bodies(big)


def test_the_committed_example_is_what_the_script_writes() -> None:
    rows = _make_reviews().build()
    lines = (ROOT / "examples" / "reviews.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == rows
