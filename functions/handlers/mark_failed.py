from __future__ import annotations

from typing import Any

from sluice.failure import mark_failed
from sluice.notify import publish

from .observability import instrumented, job_finished, logger
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    rt = runtime(context)
    error = event.get("error") or {}
    detail = mark_failed(
        s3=rt.s3,
        store=rt.store,
        state=event,
        error=str(error.get("Error", "Unknown")),
        cause=str(error.get("Cause", "")),
    )
    logger.thread_safe_append_keys(job_id=detail["job_id"])
    publish(rt.events, bus=rt.settings.event_bus, detail_type="Sluice Job Failed", detail=detail)
    job_finished(detail, failed=True)
    return detail
