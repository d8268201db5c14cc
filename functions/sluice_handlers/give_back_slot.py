from __future__ import annotations

from typing import Any

from sluice.contract import SHARD_KEY, ShardSpec
from sluice.limits.shard_slots import ShardSlots, SlotPolicy

from .observability import instrumented, logger
from .runtime import runtime


@instrumented
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The shard's slot among the environment's shards in flight given back, at its end."""
    rt = runtime(context, "give_back_slot")
    spec = ShardSpec.from_dict(event[SHARD_KEY])
    given = ShardSlots(rt.store.table, SlotPolicy(cap=rt.settings.max_shards_in_flight)).give_back(
        spec.job_id, spec.shard
    )
    logger.info("shard slot given back", extra={"given_back": given})
    return {"given_back": given}
