"""The settings sets each function reads: infra gives it only their variables, the local cloud
only those of the environment it runs in, and its `Settings` holds only them."""

from __future__ import annotations

from . import settings as sets
from .steps import STEPS, WEBHOOK

# A step that works through a shard calls the provider, reads and writes the bucket (its lines,
# outputs and cached answers), and may open the family's Batch API to look at or cancel its batches.
SHARD_SETS: tuple[type[sets.SettingsSet], ...] = (
    sets.JobTable,
    sets.JobBucket,
    sets.Provider,
    sets.ProviderKey,
    sets.Send,
    sets.SharedLimits,
    sets.Batch,
    sets.Cache,
)

READS: dict[str, tuple[type[sets.SettingsSet], ...]] = {
    # what a job gets for each option it leaves unset, and how its shards are cut and sent
    "plan": (
        sets.JobTable,
        sets.JobBucket,
        sets.Provider,
        sets.JobDefaults,
        sets.Slots,
        sets.SharedLimits,
        sets.Batch,
        sets.Cache,
    ),
    "take_slot": (sets.JobTable, sets.Slots),
    "give_back_slot": (sets.JobTable, sets.Slots),
    "run_shard": SHARD_SETS,
    "submit": SHARD_SETS,
    "await_shard": (sets.JobTable,),
    "collect": SHARD_SETS,
    "submit_batch": SHARD_SETS,
    "collect_batch": SHARD_SETS,
    "fail_shard": SHARD_SETS,
    # the cache's compaction, and the answers' times it keeps for later deadline plans by model
    "merge": (sets.JobTable, sets.JobBucket, sets.Provider, sets.Cache),
    "notify": (sets.JobTable, sets.Events),
    # cancels a failed job's open work through a shard's context, then publishes its end
    "mark_failed": (*SHARD_SETS, sets.Events),
    WEBHOOK.name: (sets.JobTable, sets.WebhookSigning),
}
assert READS.keys() == {*STEPS, WEBHOOK.name}, "every function declares the settings it reads"


def variables_read(function: str) -> frozenset[str]:
    """The SLUICE_* variables of the function's settings sets: all it is given."""
    return frozenset().union(*(s.variables() for s in READS[function]))
