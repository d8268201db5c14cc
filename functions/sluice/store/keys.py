"""The table's key layout, written once: every reader and writer of job state builds its keys here.

The rows of a job are keyed so that no item or partition takes reads or writes that grow with the
number of shards in flight: the job row alone under `JOB#<job>`, and each shard's row and its item
rows under a partition of their own, `JOB#<job>#<shard>`, which only that shard's steps (and the
webhooks of its items) touch. The job's counts are the sum of its shard rows'.
"""

from __future__ import annotations

from sluice.contract import PARTITION_KEY, SORT_KEY

JOB_SORT_KEY = "META"
SHARD_SORT_KEY = "SHARD"
ITEM_PREFIX = "ITEM#"
ITEM_WIDTH = 9
HOLD_PREFIX = "HOLD#"


def job_partition(job_id: str) -> str:
    return f"JOB#{job_id}"


def shard_partition(job_id: str, shard: int) -> str:
    return f"JOB#{job_id}#{shard:05d}"


def item_sort_key(line: int) -> str:
    return f"{ITEM_PREFIX}{line:0{ITEM_WIDTH}d}"


def job_key(job_id: str) -> dict[str, str]:
    return {PARTITION_KEY: job_partition(job_id), SORT_KEY: JOB_SORT_KEY}


def shard_key(job_id: str, shard: int) -> dict[str, str]:
    return {PARTITION_KEY: shard_partition(job_id, shard), SORT_KEY: SHARD_SORT_KEY}


def item_key(job_id: str, shard: int, line: int) -> dict[str, str]:
    return {PARTITION_KEY: shard_partition(job_id, shard), SORT_KEY: item_sort_key(line)}


DONE_PREFIX = "DONE#"


def done_key(job_id: str, shard: int, run: int, first_line: int) -> dict[str, str]:
    """A checkpoint's lines that ended with an answer, one item for them all (`JobStore.record_progress`)."""
    return {
        PARTITION_KEY: shard_partition(job_id, shard),
        SORT_KEY: f"{DONE_PREFIX}{run:05d}#{first_line:0{ITEM_WIDTH}d}",
    }


def hold_key(job_id: str, shard: int, part: int, attempt: int) -> dict[str, str]:
    """A part's hold on the provider's Batch queue (`batch_queue`), on its shard's own partition."""
    return {PARTITION_KEY: shard_partition(job_id, shard), SORT_KEY: f"{HOLD_PREFIX}{part:05d}#{attempt}"}


def response_key(response_id: str) -> dict[str, str]:
    """A background response's pointer to its item (job, shard, line), read by its webhook."""
    return {PARTITION_KEY: f"RESP#{response_id}", SORT_KEY: "RESP"}


def early_key(response_id: str) -> dict[str, str]:
    """A webhook that came before its item's row: the submitter settles the item once it is stored."""
    return {PARTITION_KEY: f"EARLY#{response_id}", SORT_KEY: "EARLY"}


def webhook_key(webhook_id: str) -> dict[str, str]:
    return {PARTITION_KEY: f"WEBHOOK#{webhook_id}", SORT_KEY: "META"}


def input_owner_key(bucket: str, key: str) -> dict[str, str]:
    """Which job an input key's outputs are for: the newest upload's (`InputRows`)."""
    return {PARTITION_KEY: f"INPUT#{bucket}/{key}", SORT_KEY: "OWNER"}
