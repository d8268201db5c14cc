"""`sluice cancel`: stop a deployed job, and its batches and background responses at the provider."""

from __future__ import annotations

import argparse
from typing import Any

from botocore.exceptions import ClientError
from sluice.contract import JobStatus
from sluice.merge.notify import publish
from sluice.providers import apis
from sluice.runners.cancel import CancelReport, JobNotFound, cancel_job

from sluice_local.console import EXIT_OK, EXIT_PROVIDER, say
from sluice_local.deployed import Deployment, aws_errors, environment
from sluice_local.deployed.jobs import job_or_fail


@aws_errors()
def run(args: argparse.Namespace) -> int:
    dep = environment(args.env, region=args.region, profile=args.profile, job_id=args.job)
    say(f"cancelling job {args.job} …")
    report = cancel(dep, args.job, reason=args.reason)
    if report.already_finished:
        say(f"job {args.job} already ended {report.status}: nothing to cancel")
        return EXIT_OK
    say(f"  execution: {'stopped' if report.execution_stopped else 'was not running'}")
    say(
        f"  provider: {report.batches_cancelled} batch(es) and "
        f"{report.responses_cancelled} background response(s) cancelled"
    )
    for failure in report.provider_failures:
        say(f"  could not cancel {failure}")
    summary = report.summary or {}
    counts = summary.get("counts") or {}
    say(
        f"job {args.job}: CANCELLED — {counts.get('results', 0)} results kept, "
        f"{counts.get('errors', 0)} lines in errors (code `cancelled` for the unfinished)"
    )
    say(f"download: sluice results {args.job} --env {dep.env}")
    if report.provider_failures:
        say(f"{len(report.provider_failures)} cancel(s) failed at the provider: that work may still be billed")
        return EXIT_PROVIDER
    return EXIT_OK


def cancel(dep: Deployment, job_id: str, *, reason: str) -> CancelReport:
    """Stop the job, its work at the provider, and end it CANCELLED; announced as Notify would."""
    try:
        report = cancel_job(
            s3=dep.s3,
            store=dep.store,
            sfn=dep.sfn,
            job_id=job_id,
            provider=lambda: (dep.provider_base_url(), dep.api_key()),
            reason=reason,
            # a Bedrock environment's batch inference jobs are stopped with the user's credentials
            bedrock=apis.bedrock_clients(dep.session),
        )
    except JobNotFound:
        job_or_fail(dep, job_id)
        raise
    if not report.already_finished:
        _announce(dep, job_id, report.summary or {})
    return report


def _announce(dep: Deployment, job_id: str, summary: dict[str, Any]) -> None:
    """Tell EventBridge, like Notify does for finished jobs; a user without the permission still cancels."""
    detail = {
        "job_id": job_id,
        "status": JobStatus.CANCELLED,
        "counts": summary.get("counts"),
        "outputs": summary.get("outputs"),
    }
    try:
        publish(dep.client("events"), bus="default", detail_type="Sluice Job Cancelled", detail=detail)
    except (ClientError, RuntimeError) as exc:
        say(f"  note: could not publish the 'Sluice Job Cancelled' event ({exc})")
