"""Which job owns an input key's outputs (`JobStore.own_input`): a key's job is never taken over while
it runs, an older upload never takes it from a newer one, and an ended job's key goes to the next."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws
from sluice.contract import JobStatus, Summary
from sluice.store.input_rows import Running, Superseded
from sluice.store.jobs import JobStore

from sluice_local.cloud import create_table

BUCKET, KEY = "b", "inbox/reviews.jsonl"


@pytest.fixture
def store() -> Iterator[JobStore]:
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        yield JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table("jobs"), ttl_days=1)


def _claimed(store: JobStore, job_id: str) -> None:
    store.claim_job(job_id, execution=f"exec-{job_id}", bucket=BUCKET, key=KEY, etag="t", started_at=0.0)


def test_a_running_jobs_key_is_refused_to_a_newer_upload_and_taken_once_it_ended(store: JobStore) -> None:
    _claimed(store, "old")
    assert store.own_input(BUCKET, KEY, "old", 100.0) is None
    # a redelivered event of the same job keeps it
    assert store.own_input(BUCKET, KEY, "old", 100.0) is None
    with pytest.raises(Running) as refused:
        store.own_input(BUCKET, KEY, "new", 200.0)
    assert (refused.value.job_id, refused.value.execution) == ("old", "exec-old")
    assert store.input_owner(BUCKET, KEY) == "old"

    store.finish_job(Summary(job_id="old", status=JobStatus.CANCELLED, input=f"s3://{BUCKET}/{KEY}"))
    assert store.own_input(BUCKET, KEY, "new", 200.0) == "old"
    assert store.input_owner(BUCKET, KEY) == "new"
    # an older upload's late event runs nothing, whether or not the newer job still runs
    with pytest.raises(Superseded, match="runs as job new"):
        store.own_input(BUCKET, KEY, "late", 150.0)


def test_a_refused_job_is_claimed_again_by_its_next_event(store: JobStore) -> None:
    _claimed(store, "new")
    refusal = Summary(job_id="new", status=JobStatus.FAILED, input=f"s3://{BUCKET}/{KEY}", error="refused")
    store.refuse_job(refusal, "old")
    row = store.job("new")
    assert row is not None and row.refused_by == "old" and row.status == JobStatus.FAILED
    # a duplicate of a job that ran is no claim; a refused one's next upload is
    _claimed(store, "ran")
    assert not store.claim_job("ran", execution="other", bucket=BUCKET, key=KEY, etag="t", started_at=1.0)
    assert store.claim_job("new", execution="again", bucket=BUCKET, key=KEY, etag="t", started_at=1.0)
    again = store.job("new")
    assert again is not None and again.refused_by is None and again.status == JobStatus.PLANNING
