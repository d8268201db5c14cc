"""The rows a webhook touches: its id (once only), the item a response settles and the shard it
wakes, the shard a batch settles. Each is a key read or a conditional write on one row; the only
index query (`by_provider_id`, a batch's shard) reads the keys and nothing else from the index."""

from __future__ import annotations

from typing import Any

from boto3.dynamodb.conditions import Attr, Key

from sluice.contract import PARTITION_KEY, PROVIDER_ID_ATTRIBUTE, PROVIDER_ID_INDEX, SORT_KEY, causes
from sluice.store.keys import SHARD_SORT_KEY, early_key, item_key, response_key, shard_key, webhook_key
from sluice.store.rows import ItemState, Rows, conditional


class Again(str):
    """A repeat delivery's answer: the task token handed out again, to a shard whose last wake
    may have failed (not the shard's one wake at the end of its wait), or empty when the shard
    still waits for other lines and nothing is to be woken."""


def _token(shard_row: dict[str, Any]) -> str | None:
    return str(shard_row["token"]) if shard_row.get("token") else None


def _token_if_nothing_waits(shard_row: dict[str, Any]) -> str | None:
    """The task token to wake a shard with, once none of its items is still out."""
    return _token(shard_row) if int(shard_row.get("waiting", 0)) <= 0 else None


class WebhookRows(Rows):
    @causes.under(causes.WEBHOOK)
    def remember_webhook(self, webhook_id: str, now: float) -> bool:
        """Record a webhook id once; False when it was seen before (a replay or a duplicate)."""
        seen = conditional(
            self._table.put_item,
            Item={**webhook_key(webhook_id), "seen_at": int(now), "expires_at": int(now) + 7 * 86400},
            ConditionExpression=Attr(PARTITION_KEY).not_exists(),
        )
        return seen is not None

    def _by_provider_id(self, provider_id: str) -> dict[str, Any] | None:
        """The key of the row that names `provider_id`: the index holds keys only."""
        page = self._table.query(
            IndexName=PROVIDER_ID_INDEX, KeyConditionExpression=Key(PROVIDER_ID_ATTRIBUTE).eq(provider_id)
        )
        rows = page.get("Items", [])
        return {name: rows[0][name] for name in (PARTITION_KEY, SORT_KEY)} if rows else None

    @causes.under(causes.WEBHOOK)
    def settle_item(self, response_id: str) -> str | None:
        """Mark a submitted item settled; the shard's task token when that was its last wait, and
        an `Again` when the item was settled before (a repeat).

        A fast provider can finish a response before the submitter has stored its id, so the
        webhook also leaves a marker the submitter checks once its item rows are written.
        """
        key = response_key(response_id)
        row = self._table.get_item(Key=key, ConsistentRead=True).get("Item")
        if row is None:
            with causes.because(causes.EARLY):
                self._table.put_item(Item={**early_key(response_id), "expires_at": self._expires()})
                # the submitter may have stored the row between the read and the marker: look once more
                row = self._table.get_item(Key=key, ConsistentRead=True).get("Item")
            if row is None:
                return None
        return self._settle_row(str(row["job_id"]), int(row["shard"]), int(row["line"]))

    def settle_early(self, job_id: str, shard: int, items: list[ItemState]) -> int:
        """Settle the just-stored items whose webhooks came before their rows; returns how many."""
        by_id = {early_key(item.provider_id)[PARTITION_KEY]: item for item in items if item.provider_id}
        keys = [early_key(item.provider_id) for item in by_id.values() if item.provider_id]
        settled = 0
        for row in self._batch_get(keys, projection=PARTITION_KEY):
            with causes.because(causes.EARLY):
                self._settle_row(job_id, shard, by_id[row[PARTITION_KEY]].line)
            settled += 1
        return settled

    @causes.caused(causes.SETTLE)
    def _settle_row(self, job_id: str, shard: int, line: int) -> str | None:
        settled = conditional(
            self._table.update_item,
            Key=item_key(job_id, shard, line),
            UpdateExpression="SET #s = :settled",
            ConditionExpression=Attr("status").eq("submitted"),
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":settled": "settled"},
        )
        if settled is None:
            # settled before, perhaps by a delivery whose wake then failed: wake again if the
            # shard has nothing left to wait for (a used token is refused harmlessly)
            causes.instead(causes.REPEAT)
            token = _token_if_nothing_waits(self._shard_row(shard_key(job_id, shard)))
            return Again(token or "")
        row = self._table.update_item(
            Key=shard_key(job_id, shard),
            UpdateExpression="ADD waiting :minus",
            ExpressionAttributeValues={":minus": -1},
            ReturnValues="ALL_NEW",
        )["Attributes"]
        return _token_if_nothing_waits(row)

    @causes.under(causes.BATCH_WEBHOOK)
    def settle_batch(self, batch_id: str, status: str) -> str | None:
        key = self._by_provider_id(batch_id)
        if key is None or key[SORT_KEY] != SHARD_SORT_KEY:
            return None
        answer = conditional(
            self._table.update_item,
            Key=key,
            UpdateExpression="SET batch_settled = :s",
            ConditionExpression=Attr("batch_settled").not_exists(),
            ExpressionAttributeValues={":s": status},
            ReturnValues="ALL_NEW",
        )
        if answer is None:
            # reported before, perhaps by a delivery whose wake then failed: wake again
            return _token(self._shard_row(key))
        return _token(answer["Attributes"])

    @causes.under(causes.POLL, causes.BATCH_SUBMIT, causes.SETTLE, causes.REPEAT, causes.SHARD_FAILED)
    def _shard_row(self, key: dict[str, str]) -> dict[str, Any]:
        return dict(self._table.get_item(Key=key, ConsistentRead=True).get("Item") or {})

    @causes.under(causes.RUN)
    def arm_shard(self, job_id: str, shard: int, token: str) -> bool:
        """Leave the shard's task token for webhooks; True when nothing is left to wait for."""
        row = self._table.update_item(
            Key=shard_key(job_id, shard),
            UpdateExpression="SET #t = :t",
            ExpressionAttributeNames={"#t": "token"},
            ExpressionAttributeValues={":t": token},
            ReturnValues="ALL_NEW",
        )["Attributes"]
        if row.get("provider_id"):
            return "batch_settled" in row
        return int(row.get("waiting", 0)) <= 0
