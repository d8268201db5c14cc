"""`sluice retry`: a new job from a finished job's failed lines, with the parent's options."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from sluice.contract import TERMINAL_STATUSES, job_option_key, output_key
from sluice.plan.plan import output_prefix

from sluice_local.console import EXIT_NOT_FOUND, EXIT_NOT_READY, EXIT_OK, CliError, need_file, say
from sluice_local.deployed import Deployment, aws_errors, environment
from sluice_local.deployed.jobs import job_or_fail, output_size, watch
from sluice_local.deployed.lines import input_chunks, local_chunks
from sluice_local.deployed.retry import INPUT_ERROR_CODES, carried_metadata, failed_lines, retry_key, write_lines
from sluice_local.deployed.submit import check_options, options_metadata, start_job


@aws_errors()
def run(args: argparse.Namespace) -> int:
    dep, new_id = retry(args)
    if new_id is None:
        return EXIT_OK
    print(new_id, flush=True)
    if args.watch:
        return watch(dep, new_id, interval=args.interval, quiet=args.quiet)
    return EXIT_OK


def retry(args: argparse.Namespace, dep: Deployment | None = None) -> tuple[Deployment, str | None]:
    """Upload the failed lines of `args.job` as a new job; the environment and the new job's id
    (None when no line is left to retry)."""
    dep = dep or environment(args.env, region=args.region, profile=args.profile, job_id=args.job)
    job = job_or_fail(dep, args.job)
    if job.status not in TERMINAL_STATUSES:
        raise CliError(f"job {args.job} is {job.status}: retry it once it has ended", EXIT_NOT_READY)
    errors_key = output_key(output_prefix(job.key), "errors")
    if output_size(dep, errors_key) is None:
        raise CliError(f"job {args.job} has no errors file (s3://{dep.bucket}/{errors_key})", EXIT_NOT_FOUND)
    picked, skipped = failed_lines(dep, errors_key, set(args.code) if args.code else None)
    for code, n in sorted(skipped.items()):
        reason = (
            "invalid input: fix the lines and submit them again"
            if code in INPUT_ERROR_CODES
            else "not selected by --code"
        )
        say(f"  not retried: {n} line(s) with {code} ({reason})")
    if not picked:
        say(f"job {args.job}: no failed lines to retry")
        return dep, None
    chunks = local_chunks(need_file(Path(args.input))) if args.input else input_chunks(dep, job)
    metadata = {**carried_metadata(dep, job), **options_metadata(args), job_option_key("parent-job"): args.job}
    check_options(metadata, dep.provider)
    with tempfile.TemporaryDirectory(prefix="sluice-retry-") as tmp:
        path = Path(tmp) / "retry.jsonl"
        write_lines(chunks, picked, path)
        key = retry_key(dep, job.key)
        new_id = start_job(
            dep, path, key, metadata, quiet=args.quiet, what=f"{len(picked):,} failed lines of {args.job}"
        )
    return dep, new_id
