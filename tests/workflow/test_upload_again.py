"""One inbox key never mixes two jobs' outputs. The newer upload wins: a user who uploads a key again
while its job runs means the new content, so the new job's Plan takes the key and the key's outbox
names hold the new job's outputs, whichever job ends last; the older job still accounts for each of
its lines, under names of its own beside them (`<name>.superseded-<job>.*`). An older upload's event
that comes after the newer one's Plan runs nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
from sluice.contract import INBOX_PREFIX, JobStatus
from sluice.plan.plan import job_id_for

from local.cloud import LocalCloud
from local.iam import REGION
from tests.conftest import request_line, write_jsonl

KEY = f"{INBOX_PREFIX}reviews.jsonl"
OUT = "outbox/reviews"


def _lines(cloud: LocalCloud, key: str) -> list[dict[str, Any]]:
    return [json.loads(row) for row in cloud.read(key).splitlines()]


def _versioned(cloud: LocalCloud) -> None:
    boto3.client("s3", region_name=REGION).put_bucket_versioning(
        Bucket=cloud.bucket, VersioningConfiguration={"Status": "Enabled"}
    )


def test_the_newer_upload_wins_and_the_older_job_reports_beside_it(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=5, map_concurrency=1)
    _versioned(cloud)
    newer: list[str] = []

    def upload_again(step: str, payload: dict) -> None:
        # as the older job's second shard starts, the user uploads the key again
        if step == "run_shard" and payload["shard"]["shard"] == 1 and not newer:
            key, etag = cloud.upload(
                write_jsonl(tmp_path / "b.jsonl", [request_line(f"b-{n}") for n in range(7)]), key=KEY
            )
            newer.append(cloud.start(cloud.object_created_event(key, etag), name="newer"))
            newer.append(job_id_for(cloud.bucket, key, etag))

    cloud.before_invoke = upload_again
    _, old_etag = cloud.upload(write_jsonl(tmp_path / "a.jsonl", [request_line(f"a-{n}") for n in range(20)]), key=KEY)
    old_job = job_id_for(cloud.bucket, KEY, old_etag)
    older = cloud.wait(cloud.start(cloud.object_created_event(KEY, old_etag), name="older"))
    cloud.before_invoke = None
    execution, new_job = newer
    ran = cloud.wait(execution)
    assert older["status"] == "SUCCEEDED" and ran["status"] == "SUCCEEDED"

    # the key's names: the newer upload's lines, all of them, nothing of the older
    assert [r["custom_id"] for r in _lines(cloud, f"{OUT}.results.jsonl")] == [f"b-{n}" for n in range(7)]
    summary = json.loads(cloud.read(f"{OUT}.summary.json"))
    assert summary["job_id"] == new_job and summary["status"] == JobStatus.SUCCEEDED
    # the older job's, beside them, though it merged last: every one of its 20 lines
    assert [i.payload["plan"]["job_id"] for i in cloud.invocations if i.step == "merge"] == [new_job, old_job]
    beside = f"{OUT}.superseded-{old_job}"
    assert [r["custom_id"] for r in _lines(cloud, f"{beside}.results.jsonl")] == [f"a-{n}" for n in range(20)]
    old_summary = json.loads(cloud.read(f"{beside}.summary.json"))
    assert old_summary["job_id"] == old_job and new_job in old_summary["error"]


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
