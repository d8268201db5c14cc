"""One inbox key never mixes two jobs' outputs, and never has two jobs spending on it at once. The
running job wins: an upload of the key while its job runs is refused at Plan, before it sends anything,
with a summary beside the key's outputs (`<name>.refused-<job>.summary.json`) naming the running job
and how to replace it; once that job has ended, the same upload runs. An older upload's event that
comes after the newer one's Plan runs nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
from sluice.contract import INBOX_PREFIX, JobStatus
from sluice.plan.plan import job_id_for

from sluice_local.cloud import LocalCloud
from sluice_local.iam import REGION
from tests.conftest import request_line, write_jsonl

KEY = f"{INBOX_PREFIX}reviews.jsonl"
OUT = "outbox/reviews"


def _lines(cloud: LocalCloud, key: str) -> list[dict[str, Any]]:
    return [json.loads(row) for row in cloud.read(key).splitlines()]


def _versioned(cloud: LocalCloud) -> None:
    boto3.client("s3", region_name=REGION).put_bucket_versioning(
        Bucket=cloud.bucket, VersioningConfiguration={"Status": "Enabled"}
    )


def test_an_upload_while_its_keys_job_runs_is_refused_and_the_running_job_owns_the_outputs(
    make_cloud, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=5, map_concurrency=1)
    _versioned(cloud)
    newer: list[str] = []
    b_file = write_jsonl(tmp_path / "b.jsonl", [request_line(f"b-{n}") for n in range(7)])

    def upload_again(step: str, payload: dict) -> None:
        # as the older job's second shard starts, the user uploads the key again
        if step == "run_shard" and payload["shard"]["shard"] == 1 and not newer:
            key, etag = cloud.upload(b_file, key=KEY)
            newer.append(cloud.start(cloud.object_created_event(key, etag), name="newer"))
            newer.append(job_id_for(cloud.bucket, key, etag))

    cloud.before_invoke = upload_again
    _, old_etag = cloud.upload(write_jsonl(tmp_path / "a.jsonl", [request_line(f"a-{n}") for n in range(20)]), key=KEY)
    old_job = job_id_for(cloud.bucket, KEY, old_etag)
    older = cloud.wait(cloud.start(cloud.object_created_event(KEY, old_etag), name="older"))
    cloud.before_invoke = None
    execution, new_job = newer
    cloud.wait(execution)
    assert older["status"] == "SUCCEEDED"

    # the newer upload's job sent nothing: refused at Plan, naming the running job and the way out
    assert not [i for i in cloud.invocations if i.step == "run_shard" and i.payload["shard"]["job_id"] == new_job]
    progress = cloud.job(new_job)
    assert progress is not None and progress.job.status == JobStatus.FAILED and progress.job.refused_by == old_job
    refused = json.loads(cloud.read(f"{OUT}.refused-{new_job}.summary.json"))
    assert refused["status"] == JobStatus.FAILED
    assert old_job in refused["error"] and f"sluice cancel {old_job}" in refused["error"]
    # the key's names hold the running job's outputs, every one of its 20 lines, nothing of the newer
    assert [r["custom_id"] for r in _lines(cloud, f"{OUT}.results.jsonl")] == [f"a-{n}" for n in range(20)]
    assert json.loads(cloud.read(f"{OUT}.summary.json"))["job_id"] == old_job
    assert not cloud.keys(f"{OUT}.superseded-")

    # once the older job has ended, the same content uploaded again runs, and its outputs are the key's
    key, etag = cloud.upload(b_file, key=KEY)
    assert job_id_for(cloud.bucket, key, etag) == new_job
    assert cloud.wait(cloud.start(cloud.object_created_event(key, etag), name="again"))["status"] == "SUCCEEDED"
    assert [r["custom_id"] for r in _lines(cloud, f"{OUT}.results.jsonl")] == [f"b-{n}" for n in range(7)]
    summary = json.loads(cloud.read(f"{OUT}.summary.json"))
    assert summary["job_id"] == new_job and summary["status"] == JobStatus.SUCCEEDED


def test_an_older_uploads_late_event_runs_nothing_and_leaves_the_newer_outputs(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=5)
    _versioned(cloud)
    _, old_etag = cloud.upload(write_jsonl(tmp_path / "a.jsonl", [request_line(f"a-{n}") for n in range(6)]), key=KEY)
    _, new_etag = cloud.upload(write_jsonl(tmp_path / "b.jsonl", [request_line(f"b-{n}") for n in range(4)]), key=KEY)
    assert cloud.wait(cloud.start(cloud.object_created_event(KEY, new_etag), name="newer"))["status"] == "SUCCEEDED"
    cloud.wait(cloud.start(cloud.object_created_event(KEY, old_etag), name="late"))
    old_job = job_id_for(cloud.bucket, KEY, old_etag)
    assert [r["custom_id"] for r in _lines(cloud, f"{OUT}.results.jsonl")] == [f"b-{n}" for n in range(4)]
    assert json.loads(cloud.read(f"{OUT}.summary.json"))["job_id"] == job_id_for(cloud.bucket, KEY, new_etag)
    # the late event's job sent nothing, and what it says of itself is beside the key's outputs
    assert not [i for i in cloud.invocations if i.step == "run_shard" and i.payload["shard"]["job_id"] == old_job]
    assert cloud.keys(f"{OUT}.superseded-{old_job}") in ([], [f"{OUT}.superseded-{old_job}.summary.json"])
