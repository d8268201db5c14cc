"""Job events on EventBridge, so users can chain work on a finished job."""

from __future__ import annotations

from typing import Any

import orjson

from sluice.contract import JobStatus, causes

SOURCE = "sluice"
# one detail-type per way a job ends, so a rule that chains work on "Completed" never fires for
# a job whose failed lines passed its threshold; `detail.status` says the same
DETAIL_TYPES = {
    JobStatus.SUCCEEDED: "Sluice Job Completed",
    JobStatus.COMPLETED_WITH_ERRORS: "Sluice Job Completed With Errors",
    JobStatus.FAILED: "Sluice Job Failed",
    # stopped at its spending cap on purpose: neither done nor broken, and resumable
    JobStatus.BUDGET_EXCEEDED: "Sluice Job Budget Exceeded",
}


def detail_type(status: str) -> str:
    return DETAIL_TYPES.get(status, DETAIL_TYPES[JobStatus.FAILED])


@causes.under(causes.NOTIFY, causes.MARK_FAILED)
def publish(events: Any, *, bus: str, detail_type: str, detail: dict[str, Any]) -> None:
    answer = events.put_events(
        Entries=[
            {"Source": SOURCE, "DetailType": detail_type, "Detail": orjson.dumps(detail).decode(), "EventBusName": bus}
        ]
    )
    if answer.get("FailedEntryCount"):
        entry = answer["Entries"][0]
        raise RuntimeError(f"EventBridge refused {detail_type!r}: {entry.get('ErrorCode')} {entry.get('ErrorMessage')}")
