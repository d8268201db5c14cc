from __future__ import annotations

import asyncio
from typing import Any

from sluice.batch import submit_batch
from sluice.shard import ShardSpec

from .observability import instrumented, shard_run
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    spec = ShardSpec.from_dict(event)
    outcome = asyncio.run(submit_batch(runtime(context).shard_context(context), spec))
    shard_run(outcome)
    # AwaitBatch reads wait_seconds; the shard travels on with its batch ids
    return {**event, **outcome}
