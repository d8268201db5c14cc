"""A deployed job's state as the table holds it: read through JobStore, described, followed."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import orjson
from botocore.exceptions import ClientError
from sluice.contract import TERMINAL_STATUSES, JobProgress, JobRow, JobStatus, ShardRow, ShardStatus
from sluice.plan.plan import job_id_for
from sluice.store.keys import job_key

from sluice_local.console import EXIT_NOT_FOUND, CliError, human_seconds, human_usd, job_exit_code, progress, say
from sluice_local.deployed.local_jobs import LOCAL_JOB_HINT
from sluice_local.deployed.stack import Deployment, error_code


def total_lines(job: JobRow) -> int | None:
    """Lines the job will account for: every non-blank line ends in results or errors."""
    if job.plan is not None:
        return job.plan.lines - job.plan.blank
    return job.requests


def with_counts(job: JobRow, shards: list[ShardRow]) -> JobProgress:
    """The job row with its lines done and failed: the sum of its shard rows (the job row keeps none)."""
    return JobProgress(job, done=sum(s.done for s in shards), failed=sum(s.failed for s in shards))


def job_shards(dep: Deployment, job: JobRow) -> list[ShardRow]:
    return dep.store.shards(job.job_id, count=job.shards or 0)


def when(epoch: float | None) -> str:
    if epoch is None:
        return "—"
    return datetime.fromtimestamp(float(epoch), tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def job_or_fail(dep: Deployment, job_id: str) -> JobRow:
    job = dep.store.job(job_id)
    if job is None:
        raise CliError(
            f"no job {job_id!r} in {dep.stack} (`sluice status --env {dep.env}` lists recent jobs; a job just "
            f"submitted appears when its Plan starts, `--watch` waits for it; {LOCAL_JOB_HINT})",
            EXIT_NOT_FOUND,
        )
    return job


# what S3 answers for an object that is not there: a GET's code, and a HEAD's (it has no body)
_NO_OBJECT = ("404", "NoSuchKey", "NotFound")


def output_size(dep: Deployment, key: str) -> int | None:
    """The size of an object in the environment's bucket; None when there is none."""
    try:
        return int(dep.s3.head_object(Bucket=dep.bucket, Key=key)["ContentLength"])
    except ClientError as exc:
        if error_code(exc) in _NO_OBJECT:
            return None
        raise


def output_body(dep: Deployment, key: str) -> Any:
    """The streaming body of an object in the environment's bucket; None when there is none."""
    try:
        return dep.s3.get_object(Bucket=dep.bucket, Key=key)["Body"]
    except ClientError as exc:
        if error_code(exc) in _NO_OBJECT:
            return None
        raise


def describe_job(dep: Deployment, job: JobRow, *, now: float | None = None, max_shards: int = 20) -> list[str]:
    now = time.time() if now is None else now
    shards = job_shards(dep, job)
    counted = with_counts(job, shards)
    status = job.status
    started = job.started_at
    finished_at = job.finished_at
    total = total_lines(job)
    done, failed = counted.done, counted.failed
    lines = [f"job {job.job_id}  {status}  (s3://{job.bucket}/{job.key})"]
    elapsed = (float(finished_at) if finished_at else now) - float(started) if started else None
    lines.append(
        f"  started {when(started)}"
        + (f", ran {human_seconds(elapsed)}" if finished_at else f", {human_seconds(elapsed)} ago")
        + (f"; mode {job.plan.mode}" if job.plan and job.plan.mode else "")
    )
    if job.budget_cap:
        # figures in nano-USD (`sluice.limits.budget`): spent is what answers cost, committed adds reservations
        cap, spent = job.budget_cap / 1e9, (job.budget_spent or 0) / 1e9
        lines.append(f"  budget {human_usd(cap)}: spent {human_usd(spent)} ({spent / cap:.0%})")
        if status == JobStatus.BUDGET_EXCEEDED:
            lines.append(f"  `sluice retry {job.job_id} --budget USD` sends the lines the budget kept back")
    if total is not None:
        pending = max(total - done - failed, 0)
        share = f"{(done + failed) / total:.0%}" if total else "100%"
        lines.append(f"  lines {total:,}: done {done:,} · failed {failed:,} · pending {pending:,}  [{share}]")
        if status not in TERMINAL_STATUSES and elapsed and elapsed > 0:
            rate = (done + failed) / elapsed
            eta = pending / rate if rate > 0 else None
            lines.append(f"  throughput {rate:,.1f} lines/s since the start · ETA {human_seconds(eta)}")
        elif elapsed and elapsed > 0:
            lines.append(f"  throughput {(done + failed) / elapsed:,.1f} lines/s")
    else:
        lines.append("  planning: reading and checking the input")
    if shards:
        by_state: dict[str, int] = {}
        for shard in shards:
            by_state[shard.status] = by_state.get(shard.status, 0) + 1
        lines.append("  shards: " + ", ".join(f"{n} {state}" for state, n in sorted(by_state.items())))
        shown = (
            shards if len(shards) <= max_shards else [s for s in shards if s.status != ShardStatus.DONE][:max_shards]
        )
        if shown:
            lines.append(
                f"  {'shard':>6}  {'status':<8} {'done':>7} {'failed':>7} {'lines':>7}  {'mode':<10} {'runs':>4}"
            )
            for s in shown:
                lines.append(
                    f"  {s.shard:>6}  {s.status:<8} {s.done:>7,} {s.failed:>7,} {s.lines:>7,}  {s.mode:<10} {s.runs:>4}"
                )
            if len(shown) < len(shards):
                lines.append(f"  … {len(shards) - len(shown):,} more shards not shown")
    summary = job.summary
    if summary is not None and summary.error:
        lines.append(f"  error: {summary.error}")
    if status in TERMINAL_STATUSES and summary is not None and summary.outputs:
        lines.append(f"  outputs: {summary.outputs.get('results')} (+ errors, summary)")
        lines.append(f"  download: sluice results {job.job_id} --env {dep.env}")
    return lines


def status_json(dep: Deployment, job: JobRow) -> str:
    """`sluice status JOB --json`: the job row (its keys as well, as it always showed them) with
    its counts, and its shard rows."""
    rows = job_shards(dep, job)
    # a shard's task token completes its wait; it has no use outside the workflow, so leave it out
    shards = [{k: v for k, v in s.as_dict().items() if k != "token"} for s in rows]
    shown = {**job_key(job.job_id), **with_counts(job, rows).as_dict()}
    return orjson.dumps({"job": shown, "shards": shards}, option=orjson.OPT_INDENT_2).decode()


def watch(dep: Deployment, job_id: str, *, interval: float, quiet: bool, start_timeout_s: float = 120.0) -> int:
    """Follow a job until it ends; the exit code says how it ended."""
    deadline = time.monotonic() + start_timeout_s
    job = dep.store.job_progress(job_id)
    if job is None:
        say(f"waiting for job {job_id} to start …")
    with progress(total=None, unit="line", desc=job_id[:32], quiet=quiet) as bar:
        while True:
            if job is None and time.monotonic() > deadline:
                raise CliError(
                    f"job {job_id} did not start within {start_timeout_s:.0f} s: is it in {dep.stack}?", EXIT_NOT_FOUND
                )
            if job is not None:
                total = total_lines(job.job)
                if total is not None and bar.total != total:
                    bar.total = total
                    bar.refresh()
                bar.update(job.done + job.failed - bar.n)
                bar.set_postfix(status=job.job.status, failed=job.failed, refresh=False)
                if job.job.status in TERMINAL_STATUSES:
                    break
            time.sleep(interval)
            job = dep.store.job_progress(job_id)
    assert job is not None
    print("\n".join(describe_job(dep, job.job)))
    return job_exit_code(job.job.status)


def _event_job(description: dict[str, Any]) -> tuple[str, str] | None:
    """(job id, key) from an execution's input, the S3 event EventBridge handed it."""
    try:
        detail = orjson.loads(description.get("input") or "{}")["detail"]
        bucket, key, etag = detail["bucket"]["name"], detail["object"]["key"], detail["object"]["etag"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return job_id_for(bucket, key, etag), key


def recent_jobs(dep: Deployment, *, limit: int) -> list[dict[str, Any]]:
    """Newest first, from the state machine's executions: a bounded read, unlike a table scan."""
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    paginator = dep.sfn.get_paginator("list_executions")
    for page in paginator.paginate(stateMachineArn=dep.state_machine_arn, PaginationConfig={"PageSize": 50}):
        for execution in page["executions"]:
            arn = execution["executionArn"]
            found = _event_job(dep.sfn.describe_execution(executionArn=arn))
            if found is None or found[0] in seen:
                continue
            job_id, key = found
            job = dep.store.job_progress(job_id)
            if job is not None and job.job.execution != arn:
                continue  # a redelivered event: the job belongs to another execution
            seen.add(job_id)
            rows.append(
                {
                    "job_id": job_id,
                    "status": job.job.status if job else execution["status"],
                    "started_at": (job.job.started_at if job else None) or execution["startDate"].timestamp(),
                    "lines": total_lines(job.job) if job else None,
                    "done": job.done if job else None,
                    "failed": job.failed if job else None,
                    "key": key,
                }
            )
            if len(rows) >= limit:
                return rows
    return rows
