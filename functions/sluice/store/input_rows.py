"""Which job an input key's outputs belong to: one item per key, naming the job of its newest upload.

A key uploaded again while its job runs starts a second job that would write the same outbox names,
and the last Merge would win, whichever content it ran. The newer upload wins instead: its Plan takes
the key (`own_input`); a job that no longer owns its key writes its outputs beside the key's, under
names of its own (`outputs_prefix`), and an older upload's job whose Plan comes after the newer's
runs nothing. Uploads are ordered by
S3's LastModified (whole seconds): of two uploads within one second, the later Plan wins.
"""

from __future__ import annotations

from boto3.dynamodb.conditions import Attr

from sluice.contract import PARTITION_KEY
from sluice.store.keys import input_owner_key
from sluice.store.rows import Rows, conditional, dynamo


class Superseded(Exception):
    """A newer upload of the key already owns it: this job's outputs would be stale."""


class InputRows(Rows):
    def own_input(self, bucket: str, key: str, job_id: str, uploaded_at: float) -> str | None:
        """Take the key for `job_id`, an upload at `uploaded_at`: the job that owned it before (to
        stop), or None. Raises `Superseded` when a newer upload's job owns it already (its events
        may come first)."""
        mine = dynamo(float(uploaded_at))
        answer = conditional(
            self._table.put_item,
            Item={**input_owner_key(bucket, key), "job_id": job_id, "uploaded_at": mine, "expires_at": self._expires()},
            ConditionExpression=(
                Attr(PARTITION_KEY).not_exists() | Attr("uploaded_at").lte(mine) | Attr("job_id").eq(job_id)
            ),
            ReturnValues="ALL_OLD",
        )
        if answer is None:
            raise Superseded(f"a newer upload of s3://{bucket}/{key} runs as another job")
        earlier = answer.get("Attributes", {}).get("job_id")
        return str(earlier) if earlier and earlier != job_id else None

    def input_owner(self, bucket: str, key: str) -> str | None:
        """The job of the key's newest upload; None when no job took it (or its row expired)."""
        row = self._table.get_item(Key=input_owner_key(bucket, key), ConsistentRead=True).get("Item") or {}
        owner = row.get("job_id")
        return str(owner) if owner else None

    def outputs_prefix(self, bucket: str, key: str, job_id: str, prefix: str) -> tuple[str, str | None]:
        """Where the job writes its outputs: the key's own prefix while it owns the key, else names
        of its own beside them (`<prefix>.superseded-<job>`), with the job that owns the key."""
        owner = self.input_owner(bucket, key)
        if owner is None or owner == job_id:
            return prefix, None
        return f"{prefix}.superseded-{job_id}", owner
