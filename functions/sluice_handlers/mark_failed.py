from __future__ import annotations

import asyncio
from typing import Any

from sluice.contract import JOBS_REFUSED, MARK_FAILED_ERROR_KEY, STEP_ERROR_KEY, MarkedFailed, Planned
from sluice.merge.mark_failed import mark_failed, record_failure
from sluice.merge.notify import publish
from sluice.runners.cancel import stop_failed_job

from .observability import count, instrumented, job_finished, logger
from .runtime import local_deps, runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    rt = runtime(context, "mark_failed")
    error = event.get(STEP_ERROR_KEY) or {}
    # after Plan, the job it planned; before, the S3 event the execution started with
    plan = event.get(Planned.KEY)
    state = event if plan is None else Planned.from_dict(plan)
    failed, cause = str(error.get("Error", "Unknown")), str(error.get("Cause", ""))
    # MarkFailed's own failure, caught by the definition: only the job's end is recorded
    failed_again = event.get(MARK_FAILED_ERROR_KEY)
    if failed_again is None and isinstance(state, Planned) and event.get(MarkedFailed.KEY) is None:
        # once, on the first call: the later ones only assemble and merge
        work, cancels = asyncio.run(
            stop_failed_job(rt.store, state, lambda: rt.shard_context(context, local_deps(context)))
        )
        if work:
            logger.warning(
                "the failed job's open work at the provider was cancelled",
                extra={
                    "batches": len(work.batches),
                    "responses": len(work.responses),
                    "batches_cancelled": cancels.batches_cancelled,
                    "responses_cancelled": cancels.responses_cancelled,
                    "already_ended": cancels.already_ended,
                    "not_cancelled": cancels.failures[:20],
                },
            )
    if failed_again is None:
        failure = mark_failed(
            s3=rt.s3,
            store=rt.store,
            state=state,
            error=failed,
            cause=cause,
            remaining_s=context.get_remaining_time_in_millis() / 1000,
        )
    else:
        failure = record_failure(
            s3=rt.s3, store=rt.store, state=state, error=failed, cause=cause, failed_again=failed_again
        )
    logger.thread_safe_append_keys(job_id=failure.job_id)
    if failure.event is not None:
        detail = failure.event.to_json()
        publish(rt.events, bus=rt.settings.event_bus, detail_type="Sluice Job Failed", detail=detail)
        job_finished(detail, failed=True)
    if failure.refused:
        # the user's to fix, and theirs to hear of (the summary, the event): a count, not a page
        count(JOBS_REFUSED)
    return failure.to_dict()
