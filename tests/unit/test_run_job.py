"""`run_job`, the tests' way to run a job: it never reads a missing output as an empty one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sluice_local.cloud import LocalCloud, run_job


class Finished:
    """A local cloud whose job ended with `status` and wrote only `written`."""

    bucket = "b"

    def __init__(self, status: str, written: dict[str, bytes]) -> None:
        self.status, self.written = status, written

    def upload(self, path: Path, *, key: str | None, metadata: Any) -> tuple[str, str]:
        return "inbox/job.jsonl", "etag"

    def object_created_event(self, key: str, etag: str) -> dict[str, Any]:
        return {}

    def start(self, event: dict[str, Any], *, name: str) -> str:
        return name

    def wait(self, arn: str) -> dict[str, Any]:
        return {"status": self.status}

    def read(self, key: str) -> bytes:
        if key in self.written:
            return self.written[key]
        raise ClientError({"Error": {"Code": "NoSuchKey", "Message": key}}, "GetObject")


def run(cloud: Finished, tmp_path: Path) -> Any:
    path = tmp_path / "job.jsonl"
    path.write_bytes(b"")
    fake: Any = cloud
    runner: LocalCloud = fake
    return run_job(runner, path)


def test_a_job_that_succeeded_without_an_errors_file_is_an_error_not_no_errors(tmp_path: Path) -> None:
    cloud = Finished(
        "SUCCEEDED", {"outbox/job.results.jsonl": b'{"custom_id": "a"}\n', "outbox/job.summary.json": b"{}"}
    )
    with pytest.raises(ClientError, match=r"outbox/job\.errors\.jsonl"):
        run(cloud, tmp_path)


def test_a_failed_job_without_outputs_reads_as_none_and_its_summary(tmp_path: Path) -> None:
    cloud = Finished("FAILED", {"outbox/job.summary.json": b'{"status": "FAILED", "error": "bad option"}'})
    job = run(cloud, tmp_path)
    assert (job.results, job.errors, job.summary["error"]) == ([], [], "bad option")


def test_a_job_refused_at_plan_succeeds_with_its_summary_alone(tmp_path: Path) -> None:
    cloud = Finished("SUCCEEDED", {"outbox/job.summary.json": b'{"status": "FAILED", "error": "bad option"}'})
    job = run(cloud, tmp_path)
    assert (job.results, job.errors, job.summary["error"]) == ([], [], "bad option")


def test_what_cannot_be_read_for_another_reason_is_raised_whatever_the_status(tmp_path: Path) -> None:
    class Denied(Finished):
        def read(self, key: str) -> bytes:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": key}}, "GetObject")

    with pytest.raises(ClientError, match="AccessDenied"):
        run(Denied("FAILED", {}), tmp_path)
