from __future__ import annotations

from typing import Any

from sluice.merge import merge_job

from .observability import instrumented, logger, scalars
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    rt = runtime(context)
    summary = merge_job(s3=rt.s3, store=rt.store, state=event)
    logger.info("job merged", extra={"status": summary["status"], **scalars(summary["counts"])})
    return {
        "job_id": event["job_id"],
        "bucket": event["bucket"],
        "key": event["key"],
        "status": summary["status"],
        "counts": summary["counts"],
        "error_rate": summary["error_rate"],
        "max_error_rate": summary["max_error_rate"],
        "outputs": summary["outputs"],
    }
