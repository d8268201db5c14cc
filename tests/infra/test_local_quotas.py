"""The local cloud's copy of each step's timeout and memory is the one the stack deploys."""

from __future__ import annotations

from infra.functions import STEPS
from local.quotas import STEP_MEMORY_MB, STEP_TIMEOUT_S


def test_local_step_timeouts_match_the_deployed_functions() -> None:
    assert {step: spec.timeout.to_seconds() for step, spec in STEPS.items()} == STEP_TIMEOUT_S


def test_local_step_memory_matches_the_deployed_functions() -> None:
    assert {step: spec.memory_mb for step, spec in STEPS.items()} == STEP_MEMORY_MB
