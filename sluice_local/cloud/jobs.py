"""A job run through the local cloud from end to end, and what it wrote, read back."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from botocore.exceptions import ClientError
from sluice.contract import ExecutionStatus, JobStatus, output_key
from sluice.merge.verify import Report, verify

from sluice_local.cloud.local_cloud import LocalCloud


@dataclass
class JobRun:
    job_id: str
    execution: dict[str, Any]
    results: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.execution["status"])

    def verify(self, input_path: Path) -> Report:
        """Invariant 1, checked the way `sluice verify` checks it."""
        with input_path.open("rb") as fh:
            return verify(
                fh,
                (orjson.dumps(r) for r in self.results),
                (orjson.dumps(e) for e in self.errors),
                self.summary or None,
            )


def run_job(cloud: LocalCloud, path: Path, *, metadata: dict[str, str] | None = None, key: str | None = None) -> JobRun:
    """Upload, start the execution the way the EventBridge rule would, wait, read the outputs."""
    from sluice.plan.plan import job_id_for, output_prefix

    key, etag = cloud.upload(path, key=key, metadata=metadata)
    job_id = job_id_for(cloud.bucket, key, etag)
    execution = cloud.wait(cloud.start(cloud.object_created_event(key, etag), name=f"{job_id}-{time.time_ns()}"))
    prefix = output_prefix(key)
    succeeded = execution["status"] == ExecutionStatus.SUCCEEDED

    def read(kind: str, *, written: bool) -> bytes | None:
        """The output, or None when a job that did not end `written` wrote none; anything else is
        raised, so that no test reads a missing file as an empty one."""
        try:
            return cloud.read(output_key(prefix, kind))
        except ClientError as exc:
            if written or exc.response["Error"]["Code"] not in ("NoSuchKey", "404"):
                raise
            return None

    raw_summary = read("summary", written=succeeded)
    summary = json.loads(raw_summary) if raw_summary else {}
    # a job Plan refused ends its execution SUCCEEDED, and FAILED with a summary alone (no counts)
    refused = summary.get("status") == JobStatus.FAILED and "counts" not in summary
    written = succeeded and not refused

    def lines(kind: str) -> list[dict[str, Any]]:
        return [json.loads(row) for row in (read(kind, written=written) or b"").splitlines()]

    return JobRun(job_id, execution, lines("results"), lines("errors"), summary)
