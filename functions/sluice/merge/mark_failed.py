"""MarkFailed: a job that cannot finish still writes what finished, and accounts for the rest."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from botocore.exceptions import ClientError

from sluice.contract import JobFailed, JobStatus, MarkedFailed, Planned, Summary, causes
from sluice.contract.model import ErrorCode
from sluice.core.failures import failure_reason, is_user_error
from sluice.merge.last_resort import account_from_input
from sluice.merge.merge import Deadlines, merge_job
from sluice.merge.outputs import OutOfTime
from sluice.merge.summary import end_job
from sluice.plan.plan import find_object, job_id_for, output_prefix

logger = logging.getLogger(__name__)

# The share of an invocation's time MarkFailed spends assembling the shards that never finished.
# Shards left over wait for the next invocation (the definition loops), which finds the ones
# already assembled finished. An invocation that assembled for longer than MERGE_AFTER_SHARE
# leaves the merge, which takes what Merge's does, to the next one too.
ASSEMBLY_SHARE = 0.4
MERGE_AFTER_SHARE = 0.1


@dataclass(frozen=True)
class Failure:
    """What one MarkFailed call did: once the job ended FAILED, the event that says so; until
    then the `shards_left` to assemble (0: only the merge) wait for its next call."""

    job_id: str
    event: JobFailed | None
    shards_left: int = 0
    refused: bool = False

    @property
    def result(self) -> MarkedFailed:
        return MarkedFailed(done=self.event is not None, shards_left=self.shards_left, refused=self.refused)

    def to_dict(self) -> dict[str, Any]:
        """The step's answer: the event's detail (the job alone while it waits), then its result."""
        detail = self.event.to_json() if self.event else {"job_id": self.job_id, "status": JobStatus.FAILED}
        return {**detail, **self.result.to_dict()}


@causes.under(causes.MARK_FAILED)
def mark_failed(
    *, s3: Any, store: Any, state: Planned | Mapping[str, Any], error: str, cause: str, remaining_s: float | None = None
) -> Failure:
    """Account for every line and write the outputs, status FAILED. `state` is the job Plan
    planned, or the execution's input (the S3 event) when Plan itself failed. `done` is False
    when the shards left to assemble, or the merge, wait for another call (`remaining_s`: the
    time this invocation has; None: no limit), and the event comes with the call that is done."""
    reason = failure_reason(error, cause)
    if not isinstance(state, Planned):
        # Plan itself failed: no shards and no manifest, so the job is the input object and the reason
        failure = _summary_only(s3, store, state, reason)
        return replace(failure, refused=is_user_error(error, cause))
    # first: the shards still running stop sending (and drawing on the budget) within one poll
    # period; every call of the loop marks again, which changes nothing once they are marked
    store.stop_shards(state.job_id, JobStatus.FAILED, shards=state.shards)
    now = time.monotonic()
    deadlines = (
        None
        if remaining_s is None
        else Deadlines(assemble=now + ASSEMBLY_SHARE * remaining_s, merge=now + MERGE_AFTER_SHARE * remaining_s)
    )
    try:
        summary = merge_job(
            s3=s3,
            store=store,
            state=state,
            status=JobStatus.FAILED,
            missing_code=ErrorCode.JOB_FAILED,
            missing_message=f"the job failed before this line finished ({reason})",
            error=reason,
            deadlines=deadlines,
        )
    except OutOfTime as exc:
        return Failure(job_id=state.job_id, event=None, shards_left=exc.left)
    return _ended(summary, reason)


def _ended(summary: Summary, reason: str) -> Failure:
    """The failure of a job whose outputs account for every line: its event, with their counts."""
    assert summary.figures is not None
    event = JobFailed(
        job_id=summary.job_id,
        status=JobStatus.FAILED,
        error=reason,
        counts=summary.figures.counts,
        outputs=summary.figures.outputs,
    )
    return Failure(job_id=summary.job_id, event=event)


def record_failure(
    *,
    s3: Any,
    store: Any,
    state: Planned | Mapping[str, Any],
    error: str,
    cause: str,
    failed_again: Mapping[str, Any],
) -> Failure:
    """MarkFailed's last resort, once MarkFailed itself failed: every line accounted for from the
    input alone (`account_from_input`), and should that fail as well, the job row and a summary
    that says why. `state` as `mark_failed`'s."""
    reason = failure_reason(error, cause)
    again = failure_reason(str(failed_again.get("Error", "Unknown")), str(failed_again.get("Cause", "")))
    reason = f"{reason}; accounting for its lines failed too: {again}"
    if not isinstance(state, Planned):
        return _summary_only(s3, store, state, reason)
    store.stop_shards(state.job_id, JobStatus.FAILED, shards=state.shards)
    try:
        summary = account_from_input(s3, store, state, reason)
    except Exception as exc:
        # the lines go unaccounted for only here, and the summary says so and why
        logger.exception("the failed job's lines could not be accounted for from its input")
        return _summary_only(s3, store, state, f"{reason}; writing its lines from the input failed: {exc!r}")
    return _ended(summary, reason)


def _summary_only(s3: Any, store: Any, state: Planned | Mapping[str, Any], reason: str) -> Failure:
    """The job FAILED with a summary in outbox/ that says why, and no other output."""
    if isinstance(state, Planned):
        job_id, bucket, key, prefix = state.job_id, state.bucket, state.key, state.output_prefix
    else:
        detail = state["event"]["detail"] if "event" in state else state["detail"]
        bucket, key = detail["bucket"]["name"], detail["object"]["key"]
        # the object's own key, as Plan would have found it, however the event encoded it; if it
        # is gone or replaced, the event's key is all there is
        with contextlib.suppress(ClientError):
            key, _ = find_object(s3, bucket, key, detail["object"]["etag"])
        job_id, prefix = job_id_for(bucket, key, detail["object"]["etag"]), output_prefix(key)
    # an event of an upload replaced since: the key's outbox names are the newer upload's job's
    prefix, _ = store.outputs_prefix(bucket, key, job_id, prefix)
    summary = Summary(job_id=job_id, status=JobStatus.FAILED, input=f"s3://{bucket}/{key}", error=reason)
    # Plan may have failed before it made the job's row, or after
    summary_at = end_job(s3, store if store.job(job_id) is not None else None, summary, bucket=bucket, prefix=prefix)
    event = JobFailed(job_id=job_id, status=JobStatus.FAILED, error=reason, summary=f"s3://{bucket}/{summary_at}")
    return Failure(job_id=job_id, event=event)
