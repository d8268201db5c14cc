"""A batch shard's row: the files it planned, the batches it created, and the one its webhook waits on.

Only the shard's own steps write it (and a webhook, `batch_settled`), on the shard's own partition.
"""

from __future__ import annotations

from typing import Any

from sluice.contract import causes
from sluice.store.keys import shard_key
from sluice.store.rows import Rows, dynamo


class BatchRows(Rows):
    @causes.under(causes.BATCH_SUBMIT)
    def begin_batch_submit(self, job_id: str, shard: int, now: float) -> float | None:
        """Stamp the shard's first SubmitBatch; the stamp of an earlier attempt if there was one.

        A retried submit uses it to know whether it must look for batches it created before.
        """
        old = self._table.update_item(
            Key=shard_key(job_id, shard),
            UpdateExpression="SET batch_submit_at = if_not_exists(batch_submit_at, :now)",
            ExpressionAttributeValues={":now": dynamo(float(now))},
            ReturnValues="ALL_OLD",
        ).get("Attributes", {})
        stamp = old.get("batch_submit_at")
        return float(stamp) if stamp is not None else None

    def set_shard_batches(self, job_id: str, shard: int, batch_ids: list[str]) -> None:
        """Record every batch the shard owns, in part order ("" for a file still waiting for room
        in the provider's queue); `provider_id` (the webhook index) names the first, which
        CollectBatch moves on to the next unfinished one."""
        first = next((batch_id for batch_id in batch_ids if batch_id), None)
        if first is None:
            return
        self._table.update_item(
            Key=shard_key(job_id, shard),
            UpdateExpression=(
                "SET batch_ids = :ids, provider_id = :first, batch_states = if_not_exists(batch_states, :none)"
            ),
            ExpressionAttributeValues={":ids": list(batch_ids), ":first": first, ":none": {}},
        )

    def plan_batch_parts(self, job_id: str, shard: int, parts: list[dict[str, Any]]) -> None:
        """Record the shard's batch files (model, tokens, lines each), none of them created yet."""
        self._table.update_item(
            Key=shard_key(job_id, shard),
            UpdateExpression=(
                "SET batch_parts = :parts, batch_ids = :ids, batch_tries = :none,"
                " batch_states = if_not_exists(batch_states, :none)"
            ),
            ExpressionAttributeValues={":parts": dynamo(parts), ":ids": [""] * len(parts), ":none": {}},
        )

    def requeue_batch(
        self, job_id: str, shard: int, batch_ids: list[str], tries: dict[str, int], retry_at: float
    ) -> None:
        """A batch the provider's full queue refused: its file waits again ("" in `batch_ids`) under
        the next attempt number, and the shard creates nothing before `retry_at`."""
        self._table.update_item(
            Key=shard_key(job_id, shard),
            UpdateExpression=(
                "SET batch_ids = :ids, batch_tries = :tries, batch_retry_at = :at ADD batch_requeued :one"
            ),
            ExpressionAttributeValues={
                ":ids": list(batch_ids),
                ":tries": dict(tries),
                ":at": dynamo(float(retry_at)),
                ":one": 1,
            },
        )

    def mark_batch_collected(self, job_id: str, shard: int, batch_id: str, state: dict[str, Any]) -> None:
        self._table.update_item(
            Key=shard_key(job_id, shard),
            UpdateExpression="SET batch_states.#b = :state",
            ExpressionAttributeNames={"#b": batch_id},
            ExpressionAttributeValues={":state": dynamo(state)},
        )

    def await_batch(self, job_id: str, shard: int, batch_id: str) -> None:
        """Point the webhook index at the batch the shard waits on next, and forget the last wake-up.

        A webhook for this batch that lands before the update is lost, which costs one polling
        interval; a stale `batch_settled` kept instead would wake the shard in a busy loop.
        """
        self._table.update_item(
            Key=shard_key(job_id, shard),
            UpdateExpression="SET provider_id = :p REMOVE batch_settled",
            ExpressionAttributeValues={":p": batch_id},
        )
