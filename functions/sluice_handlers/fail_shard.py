from __future__ import annotations

import asyncio
from typing import Any

from sluice.contract import ShardState
from sluice.runners.shard_failed import fail_shard

from .observability import instrumented, logger
from .runtime import local_deps, runtime
from .shard_state import shard_spec_from_state


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    spec = shard_spec_from_state(event)
    caught = ShardState.from_dict(event).error or {}
    failure = asyncio.run(
        fail_shard(
            runtime(context, "fail_shard").shard_context(context, local_deps(context)),
            spec,
            error=str(caught.get("Error", "Unknown")),
            cause=str(caught.get("Cause", "")),
        )
    )
    logger.warning("shard failed", extra=failure.to_dict())
    return failure.to_dict()
