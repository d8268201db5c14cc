from __future__ import annotations

from typing import Any

from sluice.contract import ShardState, SlotTaken
from sluice.limits.shard_slots import ShardSlots, SlotPolicy

from .observability import instrumented, logger
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """A slot among the environment's shards in flight for the shard, or how long it waits for one."""
    rt = runtime(context, "take_slot")
    state = ShardState.from_dict(event)
    waits = state.slot.waits if state.slot is not None else 0
    slots = ShardSlots(rt.store.table, SlotPolicy(cap=rt.settings.max_shards_in_flight))
    taken = slots.take(state.shard.job_id, state.shard.shard, waits=waits)
    result = SlotTaken(taken=taken.taken, waits=waits if taken.taken else waits + 1, wait_seconds=taken.wait_s)
    logger.info("shard slot", extra=result.to_dict())
    return result.to_dict()
