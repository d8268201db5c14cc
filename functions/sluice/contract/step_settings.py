"""The settings sets each function reads: infra gives it only their variables, the local cloud
only those of the environment it runs in, and its `Settings` holds only them."""

from __future__ import annotations

from .settings import (
    Batch,
    Cache,
    Events,
    JobBucket,
    JobDefaults,
    JobTable,
    Provider,
    ProviderKey,
    Send,
    SettingsSet,
    SharedLimits,
    Slots,
    WebhookSigning,
)
from .steps import STEPS, WEBHOOK

# A step that works through a shard calls the provider, reads and writes the bucket (its lines,
# outputs and cached answers), and may open the family's Batch API to look at or cancel its batches.
SHARD_SETS: tuple[type[SettingsSet], ...] = (
    JobTable,
    JobBucket,
    Provider,
    ProviderKey,
    Send,
    SharedLimits,
    Batch,
    Cache,
)

READS: dict[str, tuple[type[SettingsSet], ...]] = {
    # what a job gets for each option it leaves unset, and how its shards are cut and sent
    "plan": (JobTable, JobBucket, Provider, JobDefaults, Slots, SharedLimits, Batch, Cache),
    "take_slot": (JobTable, Slots),
    "give_back_slot": (JobTable, Slots),
    "run_shard": SHARD_SETS,
    "submit": SHARD_SETS,
    "await_shard": (JobTable,),
    "collect": SHARD_SETS,
    "submit_batch": SHARD_SETS,
    "collect_batch": SHARD_SETS,
    "fail_shard": SHARD_SETS,
    # the cache's compaction, and the answers' times it keeps for later deadline plans by model
    "merge": (JobTable, JobBucket, Provider, Cache),
    "notify": (JobTable, Events),
    # cancels a failed job's open work through a shard's context, then publishes its end
    "mark_failed": (*SHARD_SETS, Events),
    WEBHOOK.name: (JobTable, WebhookSigning),
}
assert READS.keys() == {*STEPS, WEBHOOK.name}, "every function declares the settings it reads"


def variables_read(function: str) -> frozenset[str]:
    """The SLUICE_* variables of the function's settings sets: all it is given."""
    return frozenset().union(*(s.variables() for s in READS[function]))
