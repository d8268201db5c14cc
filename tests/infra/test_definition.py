"""The definition's Retry and Catch, read as data: how long a step waits out throttling, and where
a failure of the failure path goes."""

from __future__ import annotations

from typing import Any

from sluice.contract import MARK_FAILED_ERROR_KEY, STEP_ERROR_KEY, MarkedFailed
from sluice.contract.definition import definition

HISTORY_EVENTS = 25_000
# TaskScheduled, TaskStarted, TaskFailed: what one refused attempt adds to the history
EVENTS_PER_ATTEMPT = 3


def _lambda_tasks(states: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {}
    for name, state in states.items():
        if state["Type"] == "Task":
            found[name] = state
        if state["Type"] == "Map":
            found.update(_lambda_tasks(state["ItemProcessor"]["States"]))
    return found


def _waits(rule: dict[str, Any]) -> list[float]:
    """The longest wait before each retry (Step Functions' FULL jitter draws from 0 to it)."""
    interval, rate, ceiling = rule["IntervalSeconds"], rule["BackoffRate"], rule.get("MaxDelaySeconds", 1e9)
    return [min(interval * rate**n, ceiling) for n in range(rule["MaxAttempts"])]


def test_every_lambda_step_waits_out_throttling_for_tens_of_minutes_within_its_history() -> None:
    for name, task in _lambda_tasks(definition()["States"]).items():
        throttling = [r for r in task["Retry"] if "Lambda.TooManyRequestsException" in r["ErrorEquals"]]
        assert len(throttling) == 1 and throttling[0]["ErrorEquals"] == ["Lambda.TooManyRequestsException"], name
        (rule,) = throttling
        waits = _waits(rule)
        assert rule["JitterStrategy"] == "FULL", name
        # on average half of each longest wait: over half an hour in all, looking again every 2 minutes at most
        assert sum(waits) / 2 >= 30 * 60 and max(waits) <= 120, name
        assert (rule["MaxAttempts"] + 1) * EVENTS_PER_ATTEMPT <= 0.01 * HISTORY_EVENTS, name


def test_a_failure_of_mark_failed_ends_in_its_last_resort_and_a_timeout_is_not_retried() -> None:
    states = definition()["States"]
    mark_failed = states["MarkFailed"]
    assert mark_failed["Catch"] == [
        {
            "ErrorEquals": ["States.ALL"],
            "ResultPath": f"$.{MARK_FAILED_ERROR_KEY}",
            "Next": "MarkFailed (from the input)",
        }
    ]
    assert not any("Sandbox.Timedout" in rule["ErrorEquals"] for rule in mark_failed["Retry"])
    last_resort = states["MarkFailed (from the input)"]
    assert last_resort["Parameters"]["FunctionName"] == mark_failed["Parameters"]["FunctionName"]
    assert last_resort["Next"] == "Job failed" and "Catch" not in last_resort
    # MarkFailed runs again until every line is accounted for
    assert states[mark_failed["Next"]]["Default"] == "MarkFailed"
    assert [c["Next"] for c in states[mark_failed["Next"]]["Choices"]] == ["Job refused", "Job failed"]


def test_a_job_refused_for_its_users_input_ends_the_execution_without_failing_it() -> None:
    states = definition()["States"]
    refused, failed = states["Every line accounted for?"]["Choices"]
    assert refused == {"Variable": MarkedFailed.path("refused"), "BooleanEquals": True, "Next": "Job refused"}
    assert states["MarkFailed"]["ResultSelector"]["refused.$"] == "$.Payload.refused"
    assert states["Job refused"] == {"Type": "Pass", "OutputPath": f"$.{STEP_ERROR_KEY}", "End": True}
    # every other way MarkFailed ends is a failed execution, and pages
    assert states[failed["Next"]]["Type"] == "Fail"
    assert states["MarkFailed (from the input)"]["Next"] == "Job failed"


def _child() -> dict[str, Any]:
    return dict(definition()["States"]["Shards"]["ItemProcessor"]["States"])


def _next_of(state: dict[str, Any]) -> set[str]:
    found = {state[k] for k in ("Next", "Default") if k in state}
    return found | {c["Next"] for c in state.get("Choices", [])} | {c["Next"] for c in state.get("Catch", [])}


def test_a_shard_takes_a_slot_before_any_provider_step_and_waits_for_one_in_the_workflow() -> None:
    states = _child()
    assert states["Answered from the cache?"]["Default"] == "Take a slot"
    assert _next_of(states["Take a slot"]) == {"Slot taken?", "ShardFailed"}
    taken = states["Slot taken?"]
    assert [c["Next"] for c in taken["Choices"]] == ["Which mode?"] and taken["Default"] == "Wait for a slot"
    wait = states["Wait for a slot"]
    assert wait["Type"] == "Wait" and wait["SecondsPath"] == "$.slot.wait_seconds" and wait["Next"] == "Take a slot"
    # only the slot's states lead to the modes: no shard sends without one
    into_modes = {name for name, state in states.items() if "Which mode?" in _next_of(state)}
    assert into_modes == {"Slot taken?"}


def test_every_end_of_a_shard_that_ran_gives_its_slot_back_and_a_failed_give_back_ends_the_shard() -> None:
    states = _child()
    into_finished = {name for name, state in states.items() if "Shard finished" in _next_of(state)}
    # a shard the cache answered whole never took a slot
    assert into_finished == {"Answered from the cache?", "Give the slot back"}
    assert {name for name, state in states.items() if "Give the slot back" in _next_of(state)} == {
        "Shard done?",
        "Collected?",
        "Batch finished?",
        "ShardFailed",
    }
    give_back = states["Give the slot back"]
    assert give_back["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "Shard finished"}]
    assert give_back["ResultPath"] is None
