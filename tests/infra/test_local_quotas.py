"""The local cloud's copy of each step's timeout is the one the stack deploys."""

from __future__ import annotations

from sluice.contract import STEPS

from local.quotas import STEP_TIMEOUT_S


def test_local_step_timeouts_match_the_deployed_functions() -> None:
    assert {name: step.timeout_s for name, step in STEPS.items()} == STEP_TIMEOUT_S
