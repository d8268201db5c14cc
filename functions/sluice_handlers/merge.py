from __future__ import annotations

from typing import Any

from sluice.cache.blobs import cache_store
from sluice.cache.compact import compact_slice
from sluice.contract import Merged, Planned
from sluice.merge.merge import merge_job

from .observability import instrumented, logger, scalars
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    rt = runtime(context, "merge")
    plan = Planned.from_dict(event[Planned.KEY])
    summary = merge_job(s3=rt.s3, store=rt.store, state=plan, settings=rt.settings)
    assert summary.figures is not None
    figures = summary.figures
    logger.info("job merged", extra={"status": summary.status, **scalars(figures.counts.to_json())})
    # the response cache's upkeep, after the job is merged: its outcome is the job's no more
    try:
        compacted = compact_slice(
            cache_store(rt.s3, rt.settings),
            ttl_days=rt.settings.cache_ttl_days,
            remaining_s=context.get_remaining_time_in_millis() / 1000.0,
        )
        logger.info("cache compacted", extra=scalars(compacted.__dict__))
    except Exception:
        logger.exception("cache compaction failed; the next job's Merge goes on with it")
    return Merged(
        job_id=plan.job_id,
        bucket=plan.bucket,
        key=plan.key,
        status=summary.status,
        counts=figures.counts.to_json(),
        error_rate=figures.error_rate,
        max_error_rate=figures.max_error_rate,
        outputs=figures.outputs,
    ).to_dict()
