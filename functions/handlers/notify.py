from __future__ import annotations

from typing import Any

from sluice.notify import detail_type, publish

from .observability import instrumented, job_finished
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    rt = runtime(context)
    publish(rt.events, bus=rt.settings.event_bus, detail_type=detail_type(event["status"]), detail=event)
    job_finished(event, failed=False)
    return event
