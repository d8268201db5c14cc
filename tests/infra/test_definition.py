"""The definition's Retry and Catch, read as data: where a failure of the failure path goes."""

from __future__ import annotations

from sluice.contract import MARK_FAILED_ERROR_KEY

from infra.definition import definition


def test_a_failure_of_mark_failed_ends_in_its_last_resort_and_a_timeout_is_not_retried() -> None:
    states = definition()["States"]
    mark_failed = states["MarkFailed"]
    assert mark_failed["Catch"] == [
        {"ErrorEquals": ["States.ALL"], "ResultPath": f"$.{MARK_FAILED_ERROR_KEY}", "Next": "MarkFailed (summary only)"}
    ]
    assert not any("Sandbox.Timedout" in rule["ErrorEquals"] for rule in mark_failed["Retry"])
    last_resort = states["MarkFailed (summary only)"]
    assert last_resort["Parameters"]["FunctionName"] == mark_failed["Parameters"]["FunctionName"]
    assert last_resort["Next"] == "Job failed" and "Catch" not in last_resort
    # MarkFailed runs again until every line is accounted for
    assert states[mark_failed["Next"]]["Default"] == "MarkFailed"
    assert [c["Next"] for c in states[mark_failed["Next"]]["Choices"]] == ["Job failed"]
