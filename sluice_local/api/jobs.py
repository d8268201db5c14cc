"""A job `sluice.run` ran on this machine: how it ended, where its outputs are, and its lines
read back from them one at a time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sluice.contract import JobStatus


def read_lines(path: Path | None) -> Iterator[dict[str, Any]]:
    """The records of a JSONL output, one at a time: a million results are never all in memory."""
    if path is None or not path.exists():
        return
    with path.open("rb") as lines:
        for line in lines:
            if line.strip():
                yield orjson.loads(line)


@dataclass(frozen=True)
class Job:
    """A local job that has ended. `status` is the job's own word (SUCCEEDED, COMPLETED_WITH_ERRORS,
    BUDGET_EXCEEDED, FAILED, CANCELLED); `results()` and `errors()` read its outputs in input order."""

    job_id: str
    status: str
    summary: dict[str, Any] = field(repr=False)
    results_path: Path | None
    errors_path: Path | None
    summary_path: Path | None
    report_path: Path | None

    @property
    def succeeded(self) -> bool:
        return self.status == JobStatus.SUCCEEDED

    def results(self) -> Iterator[dict[str, Any]]:
        """The results file's lines, in input order, as dicts (OpenAI Batch output lines)."""
        return read_lines(self.results_path)

    def errors(self) -> Iterator[dict[str, Any]]:
        """The errors file's lines, in input order, each with `error.code` and `error.message`."""
        return read_lines(self.errors_path)


class JobInterrupted(KeyboardInterrupt):
    """Ctrl-C (or a cancelled task) stopped the job: it ended CANCELLED with its outputs written,
    every answer so far in `job.results()` and the other lines `cancelled` in `job.errors()`.
    A KeyboardInterrupt, so a notebook cell or a loop over files stops as Ctrl-C stops it."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"job {job.job_id} {job.status}: its outputs hold every answer so far")
        self.job = job
