from __future__ import annotations

from typing import Any

from sluice.contract import Planned
from sluice.failure import mark_failed
from sluice.notify import publish

from .observability import instrumented, job_finished, logger
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    rt = runtime(context)
    error = event.get("error") or {}
    # after Plan, the job it planned; before, the S3 event the execution started with
    plan = event.get(Planned.KEY)
    detail = mark_failed(
        s3=rt.s3,
        store=rt.store,
        state=event if plan is None else Planned.from_dict(plan).to_dict(),
        error=str(error.get("Error", "Unknown")),
        cause=str(error.get("Cause", "")),
    )
    logger.thread_safe_append_keys(job_id=detail["job_id"])
    publish(rt.events, bus=rt.settings.event_bus, detail_type="Sluice Job Failed", detail=detail)
    job_finished(detail, failed=True)
    return detail
