"""Which job an input key's outputs belong to: one item per key, naming the job that owns them.

A key uploaded again while its job runs would start a second job writing the same outbox names, and
the last Merge would win, whichever content it ran. The job that is running wins instead: a newer
upload's Plan takes the key only from a job that has ended (`own_input`), and is refused while that
job runs (`Running`), before it sends anything, so the two never spend at once and the key's outbox
names hold one job's outputs. An older upload's job whose Plan comes after a newer one's runs nothing
(`Superseded`). A job that does not own its key writes what it says of itself beside the key's
outputs, under names of its own (`outputs_prefix`). Uploads are ordered by S3's LastModified (whole
seconds): of two uploads within one second, the later Plan counts as the newer.
"""

from __future__ import annotations

from typing import Any

from boto3.dynamodb.conditions import Attr

from sluice.contract import PARTITION_KEY, TERMINAL_STATUSES, causes
from sluice.store.keys import input_owner_key, job_key
from sluice.store.rows import Rows, conditional, dynamo

# a takeover that loses its race to another Plan looks again; more than this many is a storm of uploads
TAKE_TRIES = 3


class Superseded(Exception):
    """A newer upload of the key already owns it: this job's outputs would be stale."""


class Running(Exception):
    """An older upload's job owns the key and is still running: this job would mix its outputs, or
    spend beside it."""

    def __init__(self, job_id: str, execution: str) -> None:
        super().__init__(job_id, execution)
        self.job_id = job_id
        self.execution = execution


class InputRows(Rows):
    def own_input(self, bucket: str, key: str, job_id: str, uploaded_at: float) -> str | None:
        """Take the key for `job_id`, an upload at `uploaded_at`: the ended job that owned it before,
        or None. Raises `Superseded` when a newer upload's job owns it already (its events may come
        first), `Running` when an older upload's job owns it and has not ended. The usual upload,
        a key's first, costs one conditional write; a takeover also reads the two rows it decides on."""
        mine = dynamo(float(uploaded_at))
        item = {**input_owner_key(bucket, key), "job_id": job_id, "uploaded_at": mine, "expires_at": self._expires()}
        if conditional(
            self._table.put_item,
            Item=item,
            ConditionExpression=Attr(PARTITION_KEY).not_exists() | Attr("job_id").eq(job_id),
        ):
            return None
        for _ in range(TAKE_TRIES):
            row = self._row(input_owner_key(bucket, key))
            owner = str(row.get("job_id") or "")
            if not owner:
                condition = Attr(PARTITION_KEY).not_exists()
            else:
                if owner == job_id:
                    return None
                if row.get("uploaded_at", 0) > mine:
                    raise Superseded(f"a newer upload of s3://{bucket}/{key} runs as job {owner}")
                job = self._row(job_key(owner))
                if job and job.get("status") not in TERMINAL_STATUSES:
                    raise Running(owner, str(job.get("execution") or ""))
                condition = Attr("job_id").eq(owner)
            if conditional(self._table.put_item, Item=item, ConditionExpression=condition):
                return owner or None
        raise Superseded(f"s3://{bucket}/{key} was taken by {TAKE_TRIES} other uploads' jobs while this one looked")

    @causes.under(causes.PLAN, causes.MERGE, causes.MARK_FAILED)
    def _row(self, key: dict[str, str]) -> dict[str, Any]:
        return dict(self._table.get_item(Key=key, ConsistentRead=True).get("Item") or {})

    def input_owner(self, bucket: str, key: str) -> str | None:
        """The job that owns the key's outbox names; None when no job took it (or its row expired)."""
        owner = self._row(input_owner_key(bucket, key)).get("job_id")
        return str(owner) if owner else None

    def outputs_prefix(self, bucket: str, key: str, job_id: str, prefix: str) -> tuple[str, str | None]:
        """Where the job writes its outputs: the key's own prefix while it owns the key, else names
        of its own beside them (`<prefix>.superseded-<job>`), with the job that owns the key."""
        owner = self.input_owner(bucket, key)
        if owner is None or owner == job_id:
            return prefix, None
        return f"{prefix}.superseded-{job_id}", owner
