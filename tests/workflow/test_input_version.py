"""A job reads the version of its input that Plan cut: a user who uploads the same key again while
the job runs starts another job on the new content, and the running one still reads its own."""

from __future__ import annotations

from pathlib import Path

import boto3
from sluice.contract import INBOX_PREFIX

from sluice_local.cloud import LocalCloud, run_job
from sluice_local.iam import REGION
from tests.conftest import request_line, write_jsonl


def _overwrite_when_the_shards_start(cloud: LocalCloud, key: str, body: bytes) -> list[str]:
    """Puts `body` at `key` once, as the first shard step starts; the steps it ran before."""
    seen: list[str] = []

    def overwrite(step: str, payload: dict) -> None:
        if step == "run_shard" and step not in seen:
            cloud.write(key, body)
        seen.append(step)

    cloud.before_invoke = overwrite
    return seen


def test_an_overwrite_mid_job_leaves_the_job_reading_the_version_it_planned(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=5)
    boto3.client("s3", region_name=REGION).put_bucket_versioning(
        Bucket=cloud.bucket, VersioningConfiguration={"Status": "Enabled"}
    )
    key = f"{INBOX_PREFIX}kept.jsonl"
    replacement = b"".join(request_line(f"new-{n}") for n in range(3))
    seen = _overwrite_when_the_shards_start(cloud, key, replacement)

    run = run_job(cloud, write_jsonl(tmp_path / "kept.jsonl", [request_line(f"old-{n}") for n in range(20)]), key=key)

    assert "run_shard" in seen
    assert run.status == "SUCCEEDED", run.execution
    # every shard read the version Plan cut, not the 412 an ETag read of the newer object gives
    assert [r["custom_id"] for r in run.results] == [f"old-{n}" for n in range(20)] and run.errors == []
    assert cloud.read(key) == replacement
