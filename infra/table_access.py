"""What each Lambda does to the jobs table: its DynamoDB actions, read from its code path.

Each function's role gets exactly these actions on the table (and, for the webhook, `Query` on
the provider-id index); nothing gets Scan, DeleteItem or the index unless it is listed here.
The local cloud enforces the actions per function (`sluice_local/iam.py`), so a call a step makes that
is missing here fails tests/workflow and tests/e2e with AccessDenied.

The table is built from what the core's table helpers call (functions/sluice), and each step
from the helpers its handler reaches. A step that starts using another helper names it in its
row; a helper that starts making another call adds the action to its own line, and every step
that uses it follows.
"""

from __future__ import annotations

from types import MappingProxyType

GET = "dynamodb:GetItem"
PUT = "dynamodb:PutItem"
UPDATE = "dynamodb:UpdateItem"
QUERY = "dynamodb:Query"
BATCH_GET = "dynamodb:BatchGetItem"
BATCH_WRITE = "dynamodb:BatchWriteItem"

# --- the core's table helpers, and the calls each makes -------------------------------------

# JobStore.claim_job: the job row, once per object
CLAIM_JOB = (PUT,)
# JobStore.own_input: the key's owner row, conditionally; a takeover reads it and its job's row first
TAKE_INPUT = (PUT, GET)
# JobStore.record_plan: a row per shard (batch_writer), then the job row
RECORD_PLAN = (BATCH_WRITE, UPDATE)
# JobStore.job, .shard, .budget_state (GetItem), and the reads of several shard rows at once
# that job progress, cancel and merge are moving to (BatchGetItem)
READ_JOB = (GET, BATCH_GET)
# JobStore.record_progress and record_answered (PartWriter): item rows and a part's answered lines
# (batch_writer), then the shard and job counters
CHECKPOINT = (BATCH_WRITE, UPDATE)
# JobStore.items: the item rows of one shard, a range of sort keys
READ_ITEMS = (QUERY,)
# JobStore.settle_early: the markers of webhooks that came first, then each item and its shard
SETTLE_EARLY = (BATCH_GET, UPDATE, GET)
# JobStore.reserve_budget / release_budget / budget_state (sluice.limits.budget.Budget)
BUDGET = (UPDATE, GET)
# shared_limit.BucketTable: one item, read then written on a version
SHARED_LIMIT = (GET, UPDATE)
# batch_queue_table.QueueTable: the queue's slots read together, updated one at a time; the hold
# rows on the shard's partition, read, updated, and queried for a dead shard's while reconciling
BATCH_QUEUE = (GET, BATCH_GET, UPDATE, QUERY)
# shard_slots.ShardSlots: the slots' item read, made and updated on condition; the hold on the
# shard's row set and removed (update_item)
SHARD_SLOTS = (GET, PUT, UPDATE)
# ShardSlots.give_back: the hold removed from the shard's row, then the slots' item updated
GIVE_BACK_SLOT = (UPDATE,)
# JobStore.arm_shard, begin_batch_submit, set_shard_batches, plan_batch_parts, requeue_batch,
# mark_batch_collected, await_batch: one shard row
UPDATE_SHARD = (UPDATE,)
# JobStore.finish_job: the job row's status and summary
FINISH_JOB = (UPDATE,)
# JobStore.remember_webhook, settle_item (RESP# row, EARLY# marker, item and shard), settle_batch
WEBHOOK_SETTLE = (PUT, GET, UPDATE)

# --- each function, by the helpers its handler reaches --------------------------------------

_STEPS: dict[str, tuple[tuple[str, ...], ...]] = {
    # sluice.plan.plan.plan_job
    "plan": (CLAIM_JOB, TAKE_INPUT, RECORD_PLAN),
    # sluice.limits.shard_slots.ShardSlots.take, and .give_back at the shard's end
    "take_slot": (SHARD_SLOTS,),
    "give_back_slot": (GIVE_BACK_SLOT,),
    # sluice.runners.direct.run_direct: Stopper (job status), PartWriter, Budget, SharedLimit
    "run_shard": (READ_JOB, CHECKPOINT, BUDGET, SHARED_LIMIT),
    # sluice.runners.background.submit_background: as run_direct, plus the item rows it skips and the
    # webhooks that settled before their rows were stored
    "submit": (READ_JOB, CHECKPOINT, BUDGET, SHARED_LIMIT, READ_ITEMS, SETTLE_EARLY),
    # sluice.runners.background.collect_background: the item rows it polls, ShardRun.send, PartWriter
    "collect": (READ_JOB, CHECKPOINT, SHARED_LIMIT, READ_ITEMS),
    # sluice.runners.batch.submit.submit_batch / collect_batch: their shard row, the provider's queue, PartWriter
    "submit_batch": (READ_JOB, CHECKPOINT, BUDGET, BATCH_QUEUE, UPDATE_SHARD),
    "collect_batch": (READ_JOB, CHECKPOINT, BATCH_QUEUE, UPDATE_SHARD),
    # sluice_handlers.await_shard: JobStore.arm_shard
    "await_shard": (UPDATE_SHARD,),
    # sluice.merge.merge.merge_job; sluice.merge.mark_failed.mark_failed (merge_job, or the job row alone)
    "merge": (READ_JOB, FINISH_JOB),
    # and before it sluice.runners.cancel.stop_failed_job: the open work of the job's background shards' items
    # and ShardSlots.give_back_all: the slots its stopped shards held
    "mark_failed": (READ_JOB, FINISH_JOB, READ_ITEMS, GIVE_BACK_SLOT),
    # sluice.runners.shard_failed.fail_shard: its shard row and item rows, for the open work to cancel
    "fail_shard": (READ_JOB, READ_ITEMS),
    # sluice.merge.notify.publish: EventBridge only
    "notify": (),
    # sluice.runners.webhooks.handle_webhook
    "webhook": (WEBHOOK_SETTLE,),
}

# function -> the DynamoDB actions it may take on the table, sorted
TABLE_ACTIONS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType(
    {name: tuple(sorted({action for helper in helpers for action in helper})) for name, helpers in _STEPS.items()}
)
# function -> its actions on the provider-id index (JobStore._by_provider_id, behind settle_batch)
INDEX_ACTIONS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType({"webhook": (QUERY,)})
