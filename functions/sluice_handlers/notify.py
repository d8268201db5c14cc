from __future__ import annotations

from typing import Any

from sluice.contract import Merged
from sluice.merge.notify import detail_type, publish

from .observability import instrumented, job_finished
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    rt = runtime(context, "notify")
    detail = Merged.from_dict(event).to_dict()
    publish(rt.events, bus=rt.settings.event_bus, detail_type=detail_type(detail["status"]), detail=detail)
    job_finished(detail, failed=False)
    return {}
