from __future__ import annotations

import asyncio
from typing import Any

from sluice.runners.background import collect_background

from .observability import instrumented, shard_run
from .runtime import local_deps, runtime
from .shard_state import shard_spec_from_state


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    spec = shard_spec_from_state(event)
    ctx = runtime(context, "collect").shard_context(context, local_deps(context))
    outcome = asyncio.run(collect_background(ctx, spec)).to_dict()
    shard_run(outcome)
    return outcome
