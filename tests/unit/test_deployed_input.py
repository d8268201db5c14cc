"""`sluice status LINE` and `sluice retry` read a deployed job's input as the job ran it: by the VersionId
Plan recorded, so new content uploaded under the key since changes nothing they read."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.contract import ShardSpec, manifest_key
from sluice.store.jobs import JobStore

from sluice_local.cloud import create_table
from sluice_local.console import CliError
from sluice_local.deployed.lines import input_chunks

BUCKET = "sluice-inputs"
KEY = "inbox/reviews.jsonl"
ORIGINAL = b'{"custom_id": "a-0"}\n{"custom_id": "a-1"}\n'


def _job(s3: Any, *, versioned: bool, planned: bool) -> tuple[Any, Any]:
    """A job planned on ORIGINAL, and the key since overwritten with new content."""
    s3.create_bucket(Bucket=BUCKET)
    if versioned:
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket=BUCKET, Key=KEY, Body=ORIGINAL)
    create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
    store = JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table("jobs"), ttl_days=1)
    store.claim_job("job", execution="e", bucket=BUCKET, key=KEY, etag=first["ETag"], started_at=0.0)
    if planned:
        spec = ShardSpec(
            job_id="job",
            shard=0,
            bucket=BUCKET,
            key=KEY,
            etag=first["ETag"],
            version_id=first.get("VersionId", ""),
            start=0,
            end=len(ORIGINAL),
            first_line=1,
            lines=2,
            mode="direct",
            concurrency=1,
            max_attempts=1,
        )
        s3.put_object(Bucket=BUCKET, Key=manifest_key("job"), Body=orjson.dumps([spec.to_item()]))
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=b'{"custom_id": "b-0"}\n')
    job = store.job("job")
    assert job is not None
    return SimpleNamespace(s3=s3), job


def test_a_job_in_a_versioned_bucket_is_read_as_it_ran_after_the_key_was_overwritten() -> None:
    with mock_aws():
        dep, job = _job(boto3.client("s3", region_name="us-east-1"), versioned=True, planned=True)
        assert b"".join(input_chunks(dep, job)) == ORIGINAL


@pytest.mark.parametrize("versioned", [True, False])
def test_an_overwritten_input_with_no_recorded_version_asks_for_the_original_file(versioned: bool) -> None:
    # unversioned: only the newest object is kept; no manifest yet: no version recorded, read by ETag
    with mock_aws():
        dep, job = _job(boto3.client("s3", region_name="us-east-1"), versioned=versioned, planned=versioned)
        if versioned:
            dep.s3.delete_object(Bucket=BUCKET, Key=manifest_key("job"))
        with pytest.raises(CliError, match="gone or changed since job job ran; pass --input FILE"):
            b"".join(input_chunks(dep, job))
