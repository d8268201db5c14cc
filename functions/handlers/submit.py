from __future__ import annotations

import asyncio
from typing import Any

from sluice.background import submit_background
from sluice.shard import ShardSpec

from .observability import instrumented, shard_run
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    spec = ShardSpec.from_dict(event)
    outcome = asyncio.run(submit_background(runtime(context).shard_context(context), spec))
    shard_run(outcome)
    # the workflow loops on this state: hand the shard back along with how far it got
    return {**event, **outcome}
