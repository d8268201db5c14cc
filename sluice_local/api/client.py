"""`sluice.Client`: a deployed environment from Python, through the code of `sluice submit`,
`status`, `results`, `cancel` and `retry`."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from sluice.contract import TERMINAL_STATUSES, output_key
from sluice.plan.plan import output_prefix

from sluice_local.api.errors import NotFound, NotReady, ProviderError, as_sluice_errors
from sluice_local.api.options import Source, input_file, parse
from sluice_local.cli import cancel as cancel_command
from sluice_local.cli import results as results_command
from sluice_local.cli import retry as retry_command
from sluice_local.cli import submit as submit_command
from sluice_local.deployed import Deployment, aws_errors, environment
from sluice_local.deployed.jobs import job_or_fail, output_body, with_counts

# what a job is before its Plan writes its row: the upload is in, the S3 event on its way
SUBMITTED = "SUBMITTED"


class Client:
    """One environment: the stack Sluice-<env>, found with your AWS configuration (or `region`, `profile`)."""

    def __init__(self, env: str | None = None, *, region: str | None = None, profile: str | None = None) -> None:
        self.env = env or os.environ.get("SLUICE_ENV", "dev")
        self._where = {"env": self.env, "region": region, "profile": profile}
        with as_sluice_errors():
            self.deployment: Deployment = environment(self.env, region=region, profile=profile)

    def submit(self, source: Source, /, *, name: str | None = None, **options: Any) -> DeployedJob:
        """Upload `source` (a JSONL path, or request dicts) to the inbox with `options` as `sluice submit`
        takes them; the job starts from the S3 event. `name`: the object's name under inbox/."""
        with as_sluice_errors(), aws_errors(), input_file(source, name=name or "requests") as path:
            args = parse("submit", [str(path)], {"quiet": True, "name": name, **options, **self._where})
            _, job_id = submit_command.submit(args, self.deployment)
        return DeployedJob(self, job_id, submitted=True)

    def job(self, job_id: str) -> DeployedJob:
        """A job of this environment, by the id `submit` (or `sluice submit`) gave."""
        with as_sluice_errors(), aws_errors():
            job_or_fail(self.deployment, job_id)
        return DeployedJob(self, job_id)


class DeployedJob:
    """A job of a deployed environment; each method reads its state afresh."""

    def __init__(self, client: Client, job_id: str, *, submitted: bool = False) -> None:
        self.client = client
        self.job_id = job_id
        self._submitted = submitted

    def __repr__(self) -> str:
        return f"DeployedJob({self.job_id!r}, env={self.client.env!r})"

    @property
    def _dep(self) -> Deployment:
        return self.client.deployment

    def status(self) -> str:
        """The job's status; SUBMITTED for a job this client uploaded whose Plan has not started yet."""
        with as_sluice_errors(), aws_errors():
            row = self._dep.store.job(self.job_id)
            if row is None and self._submitted:
                return SUBMITTED
            return (row or job_or_fail(self._dep, self.job_id)).status

    def progress(self) -> dict[str, Any]:
        """The job row with its lines done and failed, as `sluice status JOB --json` shows it."""
        with as_sluice_errors(), aws_errors():
            row = job_or_fail(self._dep, self.job_id)
            return with_counts(row, self._dep.store.shards(self.job_id, count=row.shards or 0)).as_dict()

    def wait(self, *, interval: float = 5.0, timeout: float | None = None, start_timeout: float = 120.0) -> str:
        """Poll until the job ends; its final status. `timeout` (seconds) raises TimeoutError, the job
        still running; a job that has not started within `start_timeout` raises NotFound."""
        began = time.monotonic()
        while True:
            status = self.status() if self._submitted else self._status_or_none()
            if status in TERMINAL_STATUSES:
                return str(status)
            waited = time.monotonic() - began
            if status in (None, SUBMITTED) and waited > start_timeout:
                raise NotFound(
                    f"job {self.job_id} did not start within {start_timeout:.0f} s: is it in {self._dep.stack}?"
                )
            if timeout is not None and waited > timeout:
                raise TimeoutError(f"job {self.job_id} is still {status} after {timeout:g} s")
            time.sleep(interval)

    def _status_or_none(self) -> str | None:
        with as_sluice_errors(), aws_errors():
            row = self._dep.store.job(self.job_id)
        return row.status if row else None

    def results(self) -> Iterator[dict[str, Any]]:
        """The results of an ended job, in input order, streamed from its results object."""
        return self._lines("results")

    def errors(self) -> Iterator[dict[str, Any]]:
        """The errors of an ended job, in input order, streamed from its errors object."""
        return self._lines("errors")

    def summary(self) -> dict[str, Any]:
        """The ended job's summary."""
        with as_sluice_errors(), aws_errors():
            key = self._output_key("summary")
            body = self._dep.s3.get_object(Bucket=self._dep.bucket, Key=key)["Body"].read()
        parsed: dict[str, Any] = orjson.loads(body)
        return parsed

    def download(self, out: str | os.PathLike[str] = "out") -> dict[str, Path]:
        """The ended job's outputs into `out`, with its report, as `sluice results JOB --out OUT`; the files by kind."""
        with as_sluice_errors(), aws_errors():
            self._not_started()
            _, written, report, _ = results_command.download(self._dep, self.job_id, Path(out), quiet=True)
        return {**written, **({"report": report} if report else {})}

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Stop the job and its open work at the provider, as `sluice cancel`; what finished stays in the
        results. A provider that refused some cancels raises ProviderError, the job cancelled all the same."""
        with as_sluice_errors(), aws_errors():
            report = cancel_command.cancel(self._dep, self.job_id, reason=reason)
        if report.provider_failures:
            raise ProviderError(
                f"job {self.job_id} is cancelled, but the provider refused {len(report.provider_failures)} cancel(s): "
                + "; ".join(str(f) for f in report.provider_failures)
            )

    def retry(self, *, code: list[str] | None = None, **options: Any) -> DeployedJob | None:
        """A new job of this job's failed lines (those with `code`, if given), as `sluice retry`; None when
        no line is left to retry."""
        with as_sluice_errors(), aws_errors():
            args = parse("retry", [self.job_id], {"quiet": True, "code": code, **options, **self.client._where})
            _, new_id = retry_command.retry(args, self._dep)
        return DeployedJob(self.client, new_id, submitted=True) if new_id else None

    def _not_started(self) -> None:
        """A job this client uploaded is not ready before its Plan starts, rather than unknown."""
        if not self._submitted:
            return
        if self._dep.store.job(self.job_id) is None:
            raise NotReady(f"job {self.job_id} is {SUBMITTED}: its outputs are written when it ends (`wait()` waits)")
        # its Plan has started: the row is there, and is not read again to tell
        self._submitted = False

    def _output_key(self, kind: str) -> str:
        self._not_started()
        row = results_command.ended_job(self._dep, self.job_id)
        return output_key(output_prefix(row.key), kind)

    def _lines(self, kind: str) -> Iterator[dict[str, Any]]:
        with as_sluice_errors(), aws_errors():
            body = output_body(self._dep, self._output_key(kind))
        # a job whose Plan failed has a summary only
        return iter(()) if body is None else _records(body)


def _records(body: Any) -> Iterator[dict[str, Any]]:
    """An S3 object's JSONL records as they stream in."""
    try:
        for line in body.iter_lines():
            if line.strip():
                yield orjson.loads(line)
    finally:
        body.close()
