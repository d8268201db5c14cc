from __future__ import annotations

from typing import Any

from sluice.plan import plan_job

from .runtime import runtime


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    rt = runtime()
    detail = event["event"]["detail"]
    return plan_job(
        s3=rt.s3,
        store=rt.store,
        settings=rt.settings,
        bucket=detail["bucket"]["name"],
        key=detail["object"]["key"],
        etag=detail["object"]["etag"],
        execution=event["execution"],
    )
