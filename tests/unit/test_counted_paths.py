"""The counted runs (`bench/scale/runs.py`) take every family in each of its modes, and the recorded
counts hold the calls that go around boto3: Bedrock's signed requests and its batch jobs' calls."""

from __future__ import annotations

from typing import Any

import pytest
from sluice.contract import PROVIDERS, causes
from sluice.providers import modes

from bench import capacity
from bench.scale import runs


@pytest.fixture(scope="module")
def counted() -> list[dict[str, Any]]:
    return capacity.load()


def _calls(counted: list[dict[str, Any]], variant: str) -> dict[tuple[str, str, str], int]:
    found: dict[tuple[str, str, str], int] = {}
    for run in counted:
        if run["variant"] == variant:
            for t in run["targets"]:
                key = (t["cause"], t["service"], t["operation"])
                found[key] = found.get(key, 0) + t["calls"]
    return found


def test_every_family_runs_in_every_mode_it_offers() -> None:
    taken = {(v.family, v.mode) for v in runs.VARIANTS}
    offered = {(family, mode) for family in PROVIDERS for mode in modes(family)}
    assert offered <= taken, f"not counted: {sorted(offered - taken)}"


def test_the_counts_hold_bedrocks_signed_requests_under_their_cause(counted: list[dict[str, Any]]) -> None:
    calls = _calls(counted, "bedrock direct")
    converse = calls.get((causes.SIGNED.name, "bedrock-runtime", "Converse"), 0)
    lines = sum(r["lines"] for r in counted if r["variant"] == "bedrock direct")
    assert converse == lines


def test_the_counts_hold_bedrocks_batch_jobs_and_their_events(counted: list[dict[str, Any]]) -> None:
    calls = _calls(counted, "bedrock batch")
    assert calls.get((causes.BATCH_SUBMIT.name, "bedrock", "CreateModelInvocationJob"), 0) > 0
    assert calls.get((causes.BATCH_COLLECT.name, "bedrock", "GetModelInvocationJob"), 0) > 0
    # the job-state events reach the webhook function, which wakes the shard
    occurred = {c for r in counted if r["variant"] == "bedrock batch" for c in r["occurrences"]}
    assert causes.BATCH_WEBHOOK.name in occurred
