"""`sluice status`: a deployed job's progress, the recent jobs, or one request."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
from sluice.contract import TERMINAL_STATUSES
from sluice.formats.lines import LineError

from sluice_local.console import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, CliError, need_file, say
from sluice_local.deployed import Deployment, aws_errors, environment, jobs
from sluice_local.deployed.jobs import describe_job, job_or_fail, status_json, watch, when
from sluice_local.deployed.lines import find_in_lines, input_chunks, line_outcome, local_chunks


@aws_errors()
def run(args: argparse.Namespace) -> int:
    dep = environment(args.env, region=args.region, profile=args.profile, job_id=args.job)
    if args.item is not None:
        if not args.job:
            raise CliError("--item needs the job: sluice status JOB --item CUSTOM_ID", EXIT_USAGE)
        return item_status(dep, args.job, args.item, Path(args.input) if args.input else None, as_json=args.json)
    if not args.job:
        return recent_jobs(dep, limit=args.limit, as_json=args.json)
    if args.watch:
        return watch(dep, args.job, interval=args.interval, quiet=args.quiet)
    job = job_or_fail(dep, args.job)
    if args.json:
        print(status_json(dep, job))
    else:
        print("\n".join(describe_job(dep, job)))
    return EXIT_OK


def recent_jobs(dep: Deployment, *, limit: int, as_json: bool) -> int:
    rows = jobs.recent_jobs(dep, limit=limit)
    if as_json:
        print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        return EXIT_OK
    if not rows:
        say(f"no jobs yet in {dep.stack}: start one with `sluice submit FILE --env {dep.env}`")
        return EXIT_OK

    def num(value: Any) -> str:
        return "—" if value is None else f"{int(value):,}"

    width = max(len(r["job_id"]) for r in rows)
    print(f"{'JOB':<{width}}  {'STATUS':<10} {'STARTED':<23} {'LINES':>8} {'DONE':>8} {'FAILED':>7}  INPUT")
    for r in rows:
        print(
            f"{r['job_id']:<{width}}  {r['status']:<10} {when(r['started_at']):<23} {num(r['lines']):>8} "
            f"{num(r['done']):>8} {num(r['failed']):>7}  {r['key']}"
        )
    return EXIT_OK


def item_status(dep: Deployment, job_id: str, custom_id: str, input_path: Path | None, *, as_json: bool) -> int:
    job = job_or_fail(dep, job_id)
    row = dep.store.item_by_custom_id(job_id, custom_id)
    line: int | None = row.line if row else None
    invalid: str | None = None
    if line is None:
        chunks = local_chunks(need_file(input_path)) if input_path is not None else input_chunks(dep, job)
        found = find_in_lines(chunks, custom_id)
        if found is None:
            raise CliError(f"no request with custom_id {custom_id!r} in job {job_id}", EXIT_NOT_FOUND)
        line = found[0]
        if isinstance(found[1], LineError):
            invalid = found[1].message
    outcome = line_outcome(dep, job, line)
    info: dict[str, Any] = {
        "job_id": job_id,
        "custom_id": custom_id,
        "line": line,
        "shard": outcome[0] if outcome else (row.shard if row else None),
        "state": None,
        "attempts": row.attempts if row else None,
        "provider_id": row.provider_id if row else None,
        "error": (row.error if row else None) or invalid,
    }
    if outcome is not None:
        record = outcome[1]
        error = record.get("error")
        response = record.get("response") or {}
        body = response.get("body")
        body = body if isinstance(body, dict) else {}
        info["state"] = "failed" if error else "done"
        info["status_code"] = response.get("status_code")
        info["provider_id"] = info["provider_id"] or body.get("id") or response.get("request_id")
        if error:
            info["error"] = info["error"] or f"{error.get('code')}: {error.get('message')}"
    elif row is not None:
        info["state"] = row.status
    elif invalid is not None:
        info["state"] = "invalid"
    elif job.status in TERMINAL_STATUSES:
        info["state"] = "never sent"
        info["error"] = f"the job ended {job.status} before this line was sent"
    else:
        info["state"] = "pending"
    if as_json:
        print(orjson.dumps(info, option=orjson.OPT_INDENT_2).decode())
        return EXIT_OK
    where = f"line {line:,}" + (f", shard {info['shard']}" if info["shard"] is not None else "")
    print(f"request {custom_id!r} of job {job_id} ({where})")
    print(f"  state       {info['state']}" + (f" (HTTP {info['status_code']})" if info.get("status_code") else ""))
    print(f"  attempts    {info['attempts'] if info['attempts'] is not None else '—'}")
    print(f"  provider id {info['provider_id'] or '—'}")
    print(f"  last error  {info['error'] or '—'}")
    return EXIT_OK
