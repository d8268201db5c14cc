"""`sluice submit`: check a file here, then upload it to a deployed environment's inbox."""

from __future__ import annotations

import argparse
from pathlib import Path

from sluice.contract import DEFAULT_PROVIDER

from sluice_local.cli.validate_options import schema_key
from sluice_local.console import EXIT_OK, need_file
from sluice_local.deployed import Deployment, aws_errors, environment
from sluice_local.deployed.jobs import watch
from sluice_local.deployed.submit import check_options, inbox_key, options_metadata, start_job
from sluice_local.inputs import check_file, require_valid


@aws_errors()
def run(args: argparse.Namespace) -> int:
    dep, job_id = submit(args)
    print(job_id, flush=True)
    if args.watch:
        return watch(dep, job_id, interval=args.interval, quiet=args.quiet)
    return EXIT_OK


def submit(args: argparse.Namespace, dep: Deployment | None = None) -> tuple[Deployment, str]:
    """Check the file, find the environment (unless given), upload; the environment and the job's id."""
    path = need_file(Path(args.file))
    metadata = options_metadata(args)
    # as the family the job names would take it; the environment's own is checked once found
    check = check_file(path, quiet=args.quiet, provider=args.provider or DEFAULT_PROVIDER)
    require_valid(check, allow_invalid=args.allow_invalid)
    dep = dep or environment(args.env, region=args.region, profile=args.profile)
    # Plan holds the job to the environment's family: refused here, nothing is uploaded
    check_options(metadata, dep.provider)
    key = inbox_key(args.name or path.name)
    if args.validate_schema:
        dep.s3.upload_file(args.validate_schema, dep.bucket, schema_key(args.validate_schema))
    return dep, start_job(dep, path, key, metadata, quiet=args.quiet, what=f"{check.requests:,} requests")
