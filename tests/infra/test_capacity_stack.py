"""The capacity model's record of the stack is the stack: each function's reserved concurrency."""

from __future__ import annotations

from bench import capacity
from bench.capacity_runs import reserved_concurrency
from tests.infra.conftest import Synthesis


def test_the_measured_runs_hold_the_reserved_concurrency_the_stack_sets(synthesis: Synthesis) -> None:
    recorded = capacity.load()["stack"]
    assert recorded["reserved_concurrency"] == reserved_concurrency(synthesis.raw[recorded["env"]]), (
        "bench/capacity.json is stale: run `.venv/bin/python bench/capacity.py measure`"
    )
