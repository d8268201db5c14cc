from __future__ import annotations

from typing import Any

from sluice.contract import SHARD_KEY, TASK_TOKEN_KEY, ShardSpec, causes

from .observability import instrumented, logger
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Leave the task token where webhooks find it; wake at once if they already all arrived."""
    rt = runtime(context, "await_shard")
    spec = ShardSpec.from_dict(event[SHARD_KEY])
    token = event[TASK_TOKEN_KEY]
    woke = rt.store.arm_shard(spec.job_id, spec.shard, token)
    if woke:
        with causes.because(causes.WAKE):
            rt.sfn.send_task_success(taskToken=token, output="{}")
    logger.info("shard armed", extra={"woke": woke})
    return {"armed": True}
