from __future__ import annotations

from typing import Any

from sluice.contract import PLAN_EVENT_KEY, PLAN_EXECUTION_KEY
from sluice.plan.plan import plan_job

from .observability import instrumented, logger, scalars
from .runtime import local_deps, runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    rt = runtime(context, "plan")
    detail = event[PLAN_EVENT_KEY]["detail"]
    planned = plan_job(
        s3=rt.s3,
        store=rt.store,
        settings=rt.settings,
        bucket=detail["bucket"]["name"],
        key=detail["object"]["key"],
        etag=detail["object"]["etag"],
        execution=event[PLAN_EXECUTION_KEY],
        # only the local cloud gives one: `sluice run` shows the cache's hits at once
        progress=local_deps(context).progress,
    )
    state = planned.to_dict()
    logger.thread_safe_append_keys(job_id=planned.job_id)
    logger.info("job planned", extra=scalars(state))
    return state
