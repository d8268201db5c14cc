"""The local cloud's S3 bodies on disk: read by the range asked, uploads joined on disk, and what
S3 answers unchanged."""

from __future__ import annotations

import os
from pathlib import Path

import boto3
from moto import mock_aws

from sluice_local.moto_s3_disk import on_disk
from sluice_local.simulator.config import SimConfig
from sluice_local.simulator.core import MAX_ATTEMPT_KEYS, Core

PART = 5 * 1024 * 1024


def test_bodies_live_in_files_and_a_ranged_get_reads_its_range() -> None:
    with mock_aws(), on_disk():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bodies")
        s3.put_object(Bucket="bodies", Key="k", Body=b"0123456789" * 1000)
        fds = len(os.listdir("/proc/self/fd"))
        s3.put_object(Bucket="bodies", Key="k2", Body=b"z" * 100)
        # a body holds no open file
        assert len(os.listdir("/proc/self/fd")) == fds
        got = s3.get_object(Bucket="bodies", Key="k", Range="bytes=5-14")
        assert got["Body"].read() == b"5678901234"
        assert got["ContentRange"] == "bytes 5-14/10000"
        assert s3.get_object(Bucket="bodies", Key="k")["Body"].read() == b"0123456789" * 1000
        copied = s3.copy_object(Bucket="bodies", Key="c", CopySource={"Bucket": "bodies", "Key": "k"})
        assert copied["CopyObjectResult"]["ETag"]
        assert s3.get_object(Bucket="bodies", Key="c")["Body"].read() == b"0123456789" * 1000


def test_a_completed_upload_is_its_parts_in_order() -> None:
    with mock_aws(), on_disk():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bodies")
        upload = s3.create_multipart_upload(Bucket="bodies", Key="m")["UploadId"]
        parts = []
        for number, body in ((1, b"x" * PART), (2, b"y" * 10)):
            sent = s3.upload_part(Bucket="bodies", Key="m", UploadId=upload, PartNumber=number, Body=body)
            parts.append({"PartNumber": number, "ETag": sent["ETag"]})
        done = s3.complete_multipart_upload(Bucket="bodies", Key="m", UploadId=upload, MultipartUpload={"Parts": parts})
        assert done["ETag"].strip('"').endswith("-2")
        body = s3.get_object(Bucket="bodies", Key="m")["Body"].read()
        assert len(body) == PART + 10 and body.endswith(b"x" * 2 + b"y" * 10)
        edge = s3.get_object(Bucket="bodies", Key="m", Range=f"bytes={PART - 2}-{PART + 1}")["Body"].read()
        assert edge == b"xxyy"


def test_the_local_cloud_downloads_an_output_in_ranges(tmp_path: Path) -> None:
    from sluice_local.cloud import local_cloud

    big = tmp_path / "big.jsonl"
    big.write_bytes(b"".join(b"%08d\n" % n for n in range(700_000)))
    cloud = local_cloud.LocalCloud(provider_base_url="http://127.0.0.1:1/v1", api_key="k")
    with mock_aws(), on_disk():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=cloud.bucket)
        small_part = local_cloud.UPLOAD_PART_BYTES
        try:
            local_cloud.UPLOAD_PART_BYTES = PART
            key, etag = cloud.upload(big, key="inbox/big.jsonl")
            assert etag.endswith("-2")
            assert cloud.download(key, tmp_path / "back.jsonl")
        finally:
            local_cloud.UPLOAD_PART_BYTES = small_part
        assert (tmp_path / "back.jsonl").read_bytes() == big.read_bytes()
        assert not cloud.download("inbox/none.jsonl", tmp_path / "none.jsonl")
        assert not (tmp_path / "none.jsonl").exists()


def test_the_simulator_counts_attempts_of_its_latest_keys_only() -> None:
    core = Core(SimConfig())
    assert [core.next_attempt("a"), core.next_attempt("a")] == [0, 1]
    for n in range(MAX_ATTEMPT_KEYS):
        core.next_attempt(f"k{n}")
    assert len(core.attempts) == MAX_ATTEMPT_KEYS
    assert core.next_attempt("k1") == 1
