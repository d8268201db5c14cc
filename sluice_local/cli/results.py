"""`sluice results`: download a finished job's outputs from its environment and write its report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
from sluice.contract import OUTPUT_SUFFIXES, REPORT_SUFFIX, TERMINAL_STATUSES, JobRow, output_key
from sluice.plan.plan import output_prefix

from sluice_local.checks import out_dir
from sluice_local.console import EXIT_NOT_FOUND, EXIT_NOT_READY, EXIT_OK, CliError, file_link, progress, say
from sluice_local.deployed import Deployment, aws_errors, environment
from sluice_local.deployed.jobs import job_or_fail, output_size
from sluice_local.report import write_report


@aws_errors()
def run(args: argparse.Namespace) -> int:
    out_dir(Path(args.out))
    dep = environment(args.env, region=args.region, profile=args.profile, job_id=args.job)
    status_, written, report, counts = download(dep, args.job, Path(args.out), quiet=args.quiet)
    say(f"job {args.job}: {status_} — {counts.get('results', '?')} results, {counts.get('errors', '?')} errors")
    for kind, target in written.items():
        print(f"{kind}: {target}")
    if report is not None:
        print(f"report: {file_link(report)}")
    return EXIT_OK


def ended_job(dep: Deployment, job_id: str) -> JobRow:
    """The job's row, once it has ended: its outputs are written then."""
    job = job_or_fail(dep, job_id)
    if job.status not in TERMINAL_STATUSES:
        raise CliError(
            f"job {job_id} is {job.status}: its outputs are written when it ends "
            f"(`sluice status {job_id} --env {dep.env} --watch` waits for that)",
            EXIT_NOT_READY,
        )
    return job


def download(
    dep: Deployment, job_id: str, folder: Path, *, quiet: bool
) -> tuple[str, dict[str, Path], Path | None, dict[str, Any]]:
    """An ended job's outputs into `folder`, and its report: (status, files by kind, report, counts)."""
    job = ended_job(dep, job_id)
    status_ = job.status
    prefix = output_prefix(job.key)
    stem = prefix.rsplit("/", 1)[-1]
    out = out_dir(folder)
    written: dict[str, Path] = {}
    for kind, suffix in OUTPUT_SUFFIXES.items():
        key = output_key(prefix, kind)
        size = output_size(dep, key)
        if size is None:
            continue  # a job whose plan failed has a summary only
        target = out / (stem + suffix)
        with progress(total=size, unit="B", desc=kind, quiet=quiet) as bar:
            dep.s3.download_file(dep.bucket, key, str(target), Callback=bar.update)
        written[kind] = target
    if not written:
        raise CliError(f"job {job_id} is {status_} but s3://{dep.bucket}/{prefix}.* holds no outputs", EXIT_NOT_FOUND)
    counts: dict[str, Any] = {}
    report: Path | None = None
    if "summary" in written:
        summary = orjson.loads(written["summary"].read_bytes())
        counts = summary.get("counts") or {}
        report = write_report(summary, out / (stem + REPORT_SUFFIX), files={k: p.name for k, p in written.items()})
    return status_, written, report, counts
