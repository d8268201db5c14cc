"""`sluice` against a deployed environment: found from its CloudFormation stack, never from
hand-copied names. submit, status, results, cancel and retry live here.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from sluice.model import TERMINAL_STATUSES

from local.console import (
    EXIT_AWS,
    EXIT_ENVIRONMENT,
    EXIT_INPUT,
    EXIT_NOT_FOUND,
    EXIT_NOT_READY,
    EXIT_OK,
    EXIT_PROVIDER,
    EXIT_USAGE,
    CliError,
    file_link,
    human_seconds,
    job_exit_code,
    need_file,
    progress,
    say,
)

STACK_PREFIX = "Sluice-"
REQUIRED_OUTPUTS = ("BucketName", "TableName", "StateMachineArn", "ApiKeySecretArn")
TERMINAL = TERMINAL_STATUSES
OUTPUT_SUFFIXES = (("results", ".results.jsonl"), ("errors", ".errors.jsonl"), ("summary", ".summary.json"))
# Retrying these reproduces them: the line itself is wrong, not the provider's answer.
INPUT_ERROR_CODES = frozenset(
    {
        "invalid_json",
        "invalid_line",
        "missing_custom_id",
        "duplicate_custom_id",
        "invalid_method",
        "unsupported_url",
        "invalid_body",
        "line_too_large",
        "invalid_encoding",
    }
)
_CREDENTIAL_CODES = frozenset(
    {
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AuthFailure",
    }
)
_RETRY_SUFFIX = re.compile(r"\.retry-\d+$")
READ_CHUNK = 1 << 20


@contextlib.contextmanager
def aws_errors() -> Iterator[None]:
    """botocore's exceptions, turned into one line a person can act on and an exit code."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
        ProfileNotFound,
        TokenRetrievalError,
    )

    try:
        yield
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise CliError(
            f"no AWS credentials ({exc}): set AWS_PROFILE, run `aws configure` or `aws sso login`, "
            "or export AWS_ACCESS_KEY_ID",
            EXIT_AWS,
        ) from exc
    except TokenRetrievalError as exc:
        raise CliError(f"AWS SSO session expired: run `aws sso login` ({exc})", EXIT_AWS) from exc
    except NoRegionError as exc:
        raise CliError("no AWS region: pass --region or set AWS_DEFAULT_REGION", EXIT_AWS) from exc
    except ProfileNotFound as exc:
        raise CliError(f"{exc}: check --profile / AWS_PROFILE", EXIT_AWS) from exc
    except EndpointConnectionError as exc:
        raise CliError(f"cannot reach AWS: {exc}", EXIT_AWS) from exc
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", ""))
        if code in _CREDENTIAL_CODES:
            text = f"AWS rejected the credentials ({code}): {message}"
        elif "AccessDenied" in code or code == "403":
            text = f"access denied for {exc.operation_name}: {message or code} (check your identity's IAM permissions)"
        else:
            text = f"AWS error in {exc.operation_name}: {code}: {message}"
        raise CliError(text, EXIT_AWS) from exc


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


@dataclass
class Deployment:
    """One environment, as its stack's outputs describe it."""

    env: str
    stack: str
    region: str
    outputs: dict[str, str]
    session: Any

    @property
    def bucket(self) -> str:
        return self.outputs["BucketName"]

    @property
    def table_name(self) -> str:
        return self.outputs["TableName"]

    @property
    def state_machine_arn(self) -> str:
        return self.outputs["StateMachineArn"]

    def client(self, service: str) -> Any:
        return self.session.client(service)

    @functools.cached_property
    def s3(self) -> Any:
        return self.client("s3")

    @functools.cached_property
    def sfn(self) -> Any:
        return self.client("stepfunctions")

    @functools.cached_property
    def table(self) -> Any:
        return self.session.resource("dynamodb").Table(self.table_name)

    @functools.cached_property
    def store(self) -> Any:
        from sluice.store import JobStore

        # the CLI writes no new rows, so the TTL it would stamp never matters
        return JobStore(self.table, ttl_days=14)

    def api_key(self) -> str:
        value = self.client("secretsmanager").get_secret_value(SecretId=self.outputs["ApiKeySecretArn"])
        secret = value.get("SecretString") or ""
        if not secret:
            raise CliError(f"the provider API key secret of {self.stack} is empty", EXIT_ENVIRONMENT)
        return str(secret)

    def provider_base_url(self) -> str:
        """The stack's ProviderBaseUrl output, else what its Lambda functions are configured with."""
        if self.outputs.get("ProviderBaseUrl"):
            return self.outputs["ProviderBaseUrl"]
        cfn, lam = self.client("cloudformation"), self.client("lambda")
        for page in cfn.get_paginator("list_stack_resources").paginate(StackName=self.stack):
            for resource in page["StackResourceSummaries"]:
                if resource["ResourceType"] != "AWS::Lambda::Function":
                    continue
                config = lam.get_function_configuration(FunctionName=resource["PhysicalResourceId"])
                url = (config.get("Environment") or {}).get("Variables", {}).get("SLUICE_PROVIDER_BASE_URL")
                if url:
                    return str(url)
        raise CliError(
            f"cannot tell which provider {self.stack} uses: no ProviderBaseUrl output and no Sluice function",
            EXIT_ENVIRONMENT,
        )


def connect(env: str, *, region: str | None = None, profile: str | None = None) -> Deployment:
    import boto3
    from botocore.exceptions import ClientError

    session = boto3.Session(profile_name=profile, region_name=region)
    if not session.region_name:
        raise CliError("no AWS region: pass --region or set AWS_DEFAULT_REGION", EXIT_AWS)
    cfn = session.client("cloudformation")
    stack = STACK_PREFIX + env
    try:
        found = cfn.describe_stacks(StackName=stack)["Stacks"][0]
    except ClientError as exc:
        if _error_code(exc) == "ValidationError" and "does not exist" in str(exc):
            known = _environments(cfn)
            hint = f"deployed here: {', '.join(known)}" if known else "no Sluice environment is deployed here"
            raise CliError(
                f"unknown environment {env!r}: no stack {stack} in {session.region_name} ({hint}; "
                f"deploy with `cdk deploy -c env={env}`)",
                EXIT_ENVIRONMENT,
            ) from exc
        raise
    outputs = {o["OutputKey"]: o["OutputValue"] for o in found.get("Outputs", [])}
    missing = [name for name in REQUIRED_OUTPUTS if not outputs.get(name)]
    if missing:
        raise CliError(
            f"stack {stack} ({found.get('StackStatus')}) lacks output(s) {', '.join(missing)}: "
            "is the deployment complete?",
            EXIT_ENVIRONMENT,
        )
    return Deployment(env=env, stack=stack, region=str(session.region_name), outputs=outputs, session=session)


def _environments(cfn: Any) -> list[str]:
    names: list[str] = []
    with contextlib.suppress(Exception):
        for page in cfn.get_paginator("describe_stacks").paginate():
            names.extend(
                s["StackName"].removeprefix(STACK_PREFIX)
                for s in page["Stacks"]
                if s["StackName"].startswith(STACK_PREFIX)
            )
    return sorted(names)


LOCAL_JOB_HINT = (
    "a job id printed by `sluice run` is a local job: a local run keeps nothing once it exits, "
    "and its outputs are in that run's --out directory (default: out/)"
)


def local_job_outputs(job_id: str, where: tuple[Path, ...] = (Path("out"), Path("."))) -> list[Path] | None:
    """The files a local `sluice run` of `job_id` wrote, if its summary is in ./out or here."""
    for folder in where:
        if not folder.is_dir():
            continue
        for summary in sorted(folder.glob("*.summary.json"))[:500]:
            try:
                found = orjson.loads(summary.read_bytes()).get("job_id") == job_id
            except (OSError, orjson.JSONDecodeError, AttributeError):
                continue
            if found:
                stem = summary.name.removesuffix(".summary.json")
                kinds = (".results.jsonl", ".errors.jsonl", ".summary.json", ".report.html")
                return [folder / (stem + k) for k in kinds if (folder / (stem + k)).exists()]
    return None


def refuse_local_job(job_id: str | None) -> None:
    """A local job id given to a deployed command: say what it is and where its outputs are."""
    if not job_id:
        return
    files = local_job_outputs(job_id)
    if files is not None:
        raise CliError(
            f"{job_id} is a local job (from `sluice run`): a local run keeps nothing once it exits, so no "
            f"environment knows it. Its outputs are here: {', '.join(str(f) for f in files)}",
            EXIT_NOT_FOUND,
        )


def deployment(args: argparse.Namespace) -> Deployment:
    job_id = getattr(args, "job", None)
    refuse_local_job(job_id)
    try:
        with aws_errors():
            dep = connect(args.env, region=args.region, profile=args.profile)
    except CliError as exc:
        if job_id and exc.code == EXIT_AWS:
            raise CliError(f"{exc}\n(and if {job_id} came from `sluice run`: {LOCAL_JOB_HINT})", exc.code) from exc
        raise
    say(f"environment {dep.env}: stack {dep.stack} in {dep.region}")
    return dep


def options_metadata(args: argparse.Namespace) -> dict[str, str]:
    """The job options as the object metadata Plan reads, checked by Plan's own rules first."""
    from sluice.plan import METADATA_PREFIX, JobOptions, PlanError
    from sluice.settings import Settings

    metadata: dict[str, str] = {}
    for name in (
        "mode",
        "model",
        "concurrency",
        "map_concurrency",
        "max_attempts",
        "on_batch_incomplete",
        "deadline_hours",
        "max_error_rate",
    ):
        value = getattr(args, name, None)
        if value is not None:
            metadata[METADATA_PREFIX + name.replace("_", "-")] = str(value)
    try:
        JobOptions.from_metadata(
            metadata, Settings(bucket="-", table="-", provider_base_url="-", api_key_secret_arn="-")
        )
    except PlanError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
    return metadata


def inbox_key(name: str) -> str:
    """inbox/<name>.jsonl: the EventBridge rule only starts jobs for `.jsonl` keys under inbox/."""
    name = name.strip("/").removeprefix("inbox/")
    if not name or name.startswith("."):
        raise CliError(f"bad object name {name!r}", EXIT_USAGE)
    return "inbox/" + (name if name.endswith(".jsonl") else name + ".jsonl")


def upload(dep: Deployment, path: Path, key: str, metadata: dict[str, str], *, quiet: bool) -> str:
    """Upload with a progress bar; returns the object's ETag, which (with the key) names the job."""
    with progress(total=path.stat().st_size, unit="B", desc="uploading", quiet=quiet) as bar:
        dep.s3.upload_file(
            str(path),
            dep.bucket,
            key,
            ExtraArgs={"Metadata": metadata, "ContentType": "application/jsonl"},
            Callback=bar.update,
        )
    return str(dep.s3.head_object(Bucket=dep.bucket, Key=key)["ETag"]).strip('"')


def submit(args: argparse.Namespace) -> int:
    from local.inputs import check_file, require_valid

    path = need_file(Path(args.file))
    metadata = options_metadata(args)
    check = check_file(path, quiet=args.quiet)
    require_valid(check, allow_invalid=args.allow_invalid)
    dep = deployment(args)
    key = inbox_key(args.name or path.name)
    job_id = _start(dep, path, key, metadata, quiet=args.quiet, what=f"{check.requests:,} requests")
    print(job_id, flush=True)
    if args.watch:
        return watch(dep, job_id, interval=args.interval, quiet=args.quiet)
    return EXIT_OK


def _start(dep: Deployment, path: Path, key: str, metadata: dict[str, str], *, quiet: bool, what: str) -> str:
    from sluice.plan import job_id_for

    etag = upload(dep, path, key, metadata, quiet=quiet)
    job_id = job_id_for(dep.bucket, key, etag)
    existing = dep.store.job(job_id)
    if existing is not None:
        say(
            f"s3://{dep.bucket}/{key} has exactly this content already: job {job_id} is {existing.get('status')} "
            "and will not run again (upload changed content to start a new job)"
        )
    else:
        options = ", ".join(f"{k.removeprefix('sluice-')}={v}" for k, v in metadata.items()) or "environment defaults"
        say(f"uploaded {path} ({what}) to s3://{dep.bucket}/{key} [{options}]; the job starts from the S3 event")
        say(f"follow it with: sluice status {job_id} --env {dep.env} --watch")
    return job_id


def _total(job: dict[str, Any]) -> int | None:
    """Lines the job will account for: every non-blank line ends in results or errors."""
    plan = job.get("plan") or {}
    if "lines" in plan:
        return int(plan["lines"]) - int(plan.get("blank", 0))
    return int(job["requests"]) if job.get("requests") is not None else None


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "—"
    return datetime.fromtimestamp(float(epoch), tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def job_or_fail(dep: Deployment, job_id: str) -> dict[str, Any]:
    job = dep.store.job(job_id)
    if job is None:
        raise CliError(
            f"no job {job_id!r} in {dep.stack} (`sluice status --env {dep.env}` lists recent jobs; a job just "
            f"submitted appears when its Plan starts, `--watch` waits for it; {LOCAL_JOB_HINT})",
            EXIT_NOT_FOUND,
        )
    return job


def describe_job(dep: Deployment, job: dict[str, Any], *, now: float | None = None, max_shards: int = 20) -> list[str]:
    now = time.time() if now is None else now
    status = str(job.get("status", "?"))
    started = job.get("started_at")
    finished_at = job.get("finished_at")
    total = _total(job)
    done, failed = int(job.get("done", 0)), int(job.get("failed", 0))
    plan = job.get("plan") or {}
    lines = [f"job {job['job_id']}  {status}  (s3://{job.get('bucket')}/{job.get('key')})"]
    elapsed = (float(finished_at) if finished_at else now) - float(started) if started else None
    lines.append(
        f"  started {_when(started)}"
        + (f", ran {human_seconds(elapsed)}" if finished_at else f", {human_seconds(elapsed)} ago")
        + (f"; mode {plan['mode']}" if plan.get("mode") else "")
    )
    if total is not None:
        pending = max(total - done - failed, 0)
        share = f"{(done + failed) / total:.0%}" if total else "100%"
        lines.append(f"  lines {total:,}: done {done:,} · failed {failed:,} · pending {pending:,}  [{share}]")
        if status not in TERMINAL and elapsed and elapsed > 0:
            rate = (done + failed) / elapsed
            eta = pending / rate if rate > 0 else None
            lines.append(f"  throughput {rate:,.1f} lines/s since the start · ETA {human_seconds(eta)}")
        elif elapsed and elapsed > 0:
            lines.append(f"  throughput {(done + failed) / elapsed:,.1f} lines/s")
    else:
        lines.append("  planning: reading and checking the input")
    shards = sorted(dep.store.shards(job["job_id"]), key=lambda s: int(s.get("shard", 0)))
    if shards:
        by_state: dict[str, int] = {}
        for shard in shards:
            by_state[str(shard.get("status"))] = by_state.get(str(shard.get("status")), 0) + 1
        lines.append("  shards: " + ", ".join(f"{n} {state}" for state, n in sorted(by_state.items())))
        shown = shards if len(shards) <= max_shards else [s for s in shards if s.get("status") != "DONE"][:max_shards]
        if shown:
            lines.append(
                f"  {'shard':>6}  {'status':<8} {'done':>7} {'failed':>7} {'lines':>7}  {'mode':<10} {'runs':>4}"
            )
            for s in shown:
                lines.append(
                    f"  {int(s.get('shard', 0)):>6}  {s.get('status', '?')!s:<8} {int(s.get('done', 0)):>7,} "
                    f"{int(s.get('failed', 0)):>7,} {int(s.get('lines', 0)):>7,}  "
                    f"{s.get('mode', '')!s:<10} {int(s.get('runs', 0)):>4}"
                )
            if len(shown) < len(shards):
                lines.append(f"  … {len(shards) - len(shown):,} more shards not shown")
    summary = job.get("summary") or {}
    if summary.get("error"):
        lines.append(f"  error: {summary['error']}")
    if status in TERMINAL and summary.get("outputs"):
        lines.append(f"  outputs: {summary['outputs'].get('results')} (+ errors, summary)")
        lines.append(f"  download: sluice results {job['job_id']} --env {dep.env}")
    return lines


def status(args: argparse.Namespace) -> int:
    dep = deployment(args)
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
        # a shard's task token completes its wait; it has no use outside the workflow, so leave it out
        shards = [{k: v for k, v in s.items() if k != "token"} for s in dep.store.shards(args.job)]
        print(orjson.dumps({"job": job, "shards": shards}, option=orjson.OPT_INDENT_2).decode())
    else:
        print("\n".join(describe_job(dep, job)))
    return EXIT_OK


def watch(dep: Deployment, job_id: str, *, interval: float, quiet: bool, start_timeout_s: float = 120.0) -> int:
    """Follow a job until it ends; the exit code says how it ended."""
    deadline = time.monotonic() + start_timeout_s
    job = dep.store.job(job_id)
    if job is None:
        say(f"waiting for job {job_id} to start …")
    with progress(total=None, unit="line", desc=job_id[:32], quiet=quiet) as bar:
        while True:
            if job is None and time.monotonic() > deadline:
                raise CliError(
                    f"job {job_id} did not start within {start_timeout_s:.0f} s: is it in {dep.stack}?", EXIT_NOT_FOUND
                )
            if job is not None:
                total = _total(job)
                if total is not None and bar.total != total:
                    bar.total = total
                    bar.refresh()
                bar.update(int(job.get("done", 0)) + int(job.get("failed", 0)) - bar.n)
                bar.set_postfix(status=job.get("status"), failed=int(job.get("failed", 0)), refresh=False)
                if job.get("status") in TERMINAL:
                    break
            time.sleep(interval)
            job = dep.store.job(job_id)
    assert job is not None
    print("\n".join(describe_job(dep, job)))
    return job_exit_code(str(job.get("status")))


def _event_job(description: dict[str, Any]) -> tuple[str, str] | None:
    """(job id, key) from an execution's input, the S3 event EventBridge handed it."""
    from sluice.plan import job_id_for

    try:
        detail = orjson.loads(description.get("input") or "{}")["detail"]
        bucket, key, etag = detail["bucket"]["name"], detail["object"]["key"], detail["object"]["etag"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return job_id_for(bucket, key, etag), key


def recent_jobs(dep: Deployment, *, limit: int, as_json: bool) -> int:
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
            job = dep.store.job(job_id)
            if job is not None and job.get("execution") not in (None, arn):
                continue  # a redelivered event: the job belongs to another execution
            seen.add(job_id)
            job = job or {}
            started = job.get("started_at") or execution["startDate"].timestamp()
            rows.append(
                {
                    "job_id": job_id,
                    "status": job.get("status") or execution["status"],
                    "started_at": started,
                    "lines": _total(job) if job else None,
                    "done": job.get("done"),
                    "failed": job.get("failed"),
                    "key": key,
                }
            )
            if len(rows) >= limit:
                break
        if len(rows) >= limit:
            break
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
            f"{r['job_id']:<{width}}  {r['status']:<10} {_when(r['started_at']):<23} {num(r['lines']):>8} "
            f"{num(r['done']):>8} {num(r['failed']):>7}  {r['key']}"
        )
    return EXIT_OK


def _find_in_lines(chunks: Iterator[bytes], custom_id: str) -> tuple[int, Any] | None:
    """(line number, parse result) of the first line whose custom_id matches."""
    from sluice.lines import LineError, parse_line, split_lines

    needle = orjson.dumps(custom_id)
    # an unparseable line that mentions the id is the answer only if no line properly has it
    broken: tuple[int, Any] | None = None
    for number, raw in enumerate(split_lines(chunks), start=1):
        if needle not in raw:
            continue  # cheap pre-filter: most lines can't match
        parsed = parse_line(raw, number, keep_body=False)
        if parsed is None:
            continue
        if parsed.custom_id == custom_id:
            return number, parsed
        if isinstance(parsed, LineError) and parsed.custom_id is None and broken is None:
            broken = (number, parsed)
    return broken


def _local_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while chunk := fh.read(READ_CHUNK):
            yield chunk


def _input_chunks(dep: Deployment, job: dict[str, Any]) -> Iterator[bytes]:
    """The job's input object, exactly the version the job ran (its ETag), streamed."""
    from botocore.exceptions import ClientError

    try:
        body = dep.s3.get_object(Bucket=job["bucket"], Key=job["key"], IfMatch=job["etag"])["Body"]
    except ClientError as exc:
        if _error_code(exc) in ("PreconditionFailed", "412", "NoSuchKey", "404"):
            raise CliError(
                f"s3://{job['bucket']}/{job['key']} is gone or changed since job {job['job_id']} ran; "
                "pass --input FILE with the original file",
                EXIT_NOT_FOUND,
            ) from exc
        raise
    yield from body.iter_chunks(READ_CHUNK)


def _item_row(dep: Deployment, job_id: str, custom_id: str) -> dict[str, Any] | None:
    """The request's item row, if it has one (failures, background and batch requests do)."""
    from boto3.dynamodb.conditions import Attr, Key
    from sluice.store import _plain, job_pk

    # one partition, filtered: reads only this job's rows, not the table
    kwargs: dict[str, Any] = {
        "KeyConditionExpression": Key("pk").eq(job_pk(job_id)) & Key("sk").begins_with("ITEM#"),
        "FilterExpression": Attr("custom_id").eq(custom_id),
    }
    while True:
        page = dep.table.query(**kwargs)
        if page.get("Items"):
            return dict(_plain(page["Items"][0]))
        if "LastEvaluatedKey" not in page:
            return None
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _line_outcome(dep: Deployment, job: dict[str, Any], line: int) -> tuple[int, dict[str, Any]] | None:
    """(shard, output record) of a line that has a terminal outcome, from its shard's checkpoints.

    Direct mode keeps no item row for a success, so this is where a finished line is found.
    """
    from botocore.exceptions import ClientError
    from sluice.lines import split_lines
    from sluice.merge import load_manifest

    # the checkpoint format belongs to the shard code; its own readers keep the two in step
    from sluice.parts import part_keys, read_part

    try:
        specs = load_manifest(dep.s3, str(job["bucket"]), f"jobs/{job['job_id']}/manifest.json")
    except ClientError as exc:
        if _error_code(exc) in ("NoSuchKey", "404"):
            return None  # still planning
        raise
    spec = next((s for s in specs if s.first_line <= line <= s.last_line), None)
    if spec is None:
        return None
    for key in part_keys(dep.s3, spec):
        for number, _kind, record in read_part(dep.s3, spec.bucket, key):
            if number == line:
                return spec.shard, dict(orjson.loads(record))
    # lines a failed or cancelled job never finished are written when the shard is assembled
    if _size(dep, spec.errors_key) is not None:
        body = dep.s3.get_object(Bucket=spec.bucket, Key=spec.errors_key)["Body"]
        for raw in split_lines(body.iter_chunks(READ_CHUNK)):
            record = orjson.loads(raw)
            if record.get("line") == line:
                return spec.shard, dict(record)
    return None


def item_status(dep: Deployment, job_id: str, custom_id: str, input_path: Path | None, *, as_json: bool) -> int:
    from sluice.lines import LineError

    job = job_or_fail(dep, job_id)
    row = _item_row(dep, job_id, custom_id)
    line: int | None = int(row["line"]) if row else None
    invalid: str | None = None
    if line is None:
        chunks = _local_chunks(need_file(input_path)) if input_path is not None else _input_chunks(dep, job)
        found = _find_in_lines(chunks, custom_id)
        if found is None:
            raise CliError(f"no request with custom_id {custom_id!r} in job {job_id}", EXIT_NOT_FOUND)
        line = found[0]
        if isinstance(found[1], LineError):
            invalid = found[1].message
    outcome = _line_outcome(dep, job, line)
    info: dict[str, Any] = {
        "job_id": job_id,
        "custom_id": custom_id,
        "line": line,
        "shard": outcome[0] if outcome else (row or {}).get("shard"),
        "state": None,
        "attempts": (row or {}).get("attempts"),
        "provider_id": (row or {}).get("provider_id"),
        "error": (row or {}).get("error") or invalid,
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
        info["state"] = str(row.get("status"))
    elif invalid is not None:
        info["state"] = "invalid"
    elif job.get("status") in TERMINAL:
        info["state"] = "never sent"
        info["error"] = f"the job ended {job.get('status')} before this line was sent"
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


def results(args: argparse.Namespace) -> int:
    from sluice.plan import output_prefix

    from local.checks import out_dir
    from local.report import write_report

    out_dir(Path(args.out))
    dep = deployment(args)
    job = job_or_fail(dep, args.job)
    status_ = str(job.get("status"))
    if status_ not in TERMINAL:
        raise CliError(
            f"job {args.job} is {status_}: its outputs are written when it ends "
            f"(`sluice status {args.job} --env {dep.env} --watch` waits for that)",
            EXIT_NOT_READY,
        )
    prefix = output_prefix(str(job["key"]))
    stem = prefix.rsplit("/", 1)[-1]
    out = out_dir(Path(args.out))
    written: dict[str, Path] = {}
    for kind, suffix in OUTPUT_SUFFIXES:
        key = prefix + suffix
        size = _size(dep, key)
        if size is None:
            continue  # a job whose plan failed has a summary only
        target = out / (stem + suffix)
        with progress(total=size, unit="B", desc=kind, quiet=args.quiet) as bar:
            dep.s3.download_file(dep.bucket, key, str(target), Callback=bar.update)
        written[kind] = target
    if not written:
        raise CliError(f"job {args.job} is {status_} but s3://{dep.bucket}/{prefix}.* holds no outputs", EXIT_NOT_FOUND)
    counts: dict[str, Any] = {}
    report: Path | None = None
    if "summary" in written:
        summary = orjson.loads(written["summary"].read_bytes())
        counts = summary.get("counts") or {}
        report = write_report(summary, out / f"{stem}.report.html", files={k: p.name for k, p in written.items()})
    say(f"job {args.job}: {status_} — {counts.get('results', '?')} results, {counts.get('errors', '?')} errors")
    for kind, target in written.items():
        print(f"{kind}: {target}")
    if report is not None:
        print(f"report: {file_link(report)}")
    return EXIT_OK


def _size(dep: Deployment, key: str) -> int | None:
    from botocore.exceptions import ClientError

    try:
        return int(dep.s3.head_object(Bucket=dep.bucket, Key=key)["ContentLength"])
    except ClientError as exc:
        if _error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def cancel(args: argparse.Namespace) -> int:
    from sluice.cancel import JobNotFound, cancel_job

    dep = deployment(args)
    say(f"cancelling job {args.job} …")
    try:
        report = cancel_job(
            s3=dep.s3,
            store=dep.store,
            sfn=dep.sfn,
            job_id=args.job,
            provider=lambda: (dep.provider_base_url(), dep.api_key()),
            reason=args.reason,
        )
    except JobNotFound:
        job_or_fail(dep, args.job)
        raise
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
    _announce(dep, args.job, summary)
    say(
        f"job {args.job}: CANCELLED — {counts.get('results', 0)} results kept, "
        f"{counts.get('errors', 0)} lines in errors (code `cancelled` for the unfinished)"
    )
    say(f"download: sluice results {args.job} --env {dep.env}")
    if report.provider_failures:
        say(f"{len(report.provider_failures)} cancel(s) failed at the provider: that work may still be billed")
        return EXIT_PROVIDER
    return EXIT_OK


def _announce(dep: Deployment, job_id: str, summary: dict[str, Any]) -> None:
    """Tell EventBridge, like Notify does for finished jobs; a user without the permission still cancels."""
    from botocore.exceptions import ClientError
    from sluice.notify import publish

    detail = {
        "job_id": job_id,
        "status": "CANCELLED",
        "counts": summary.get("counts"),
        "outputs": summary.get("outputs"),
    }
    try:
        publish(dep.client("events"), bus="default", detail_type="Sluice Job Cancelled", detail=detail)
    except (ClientError, RuntimeError) as exc:
        say(f"  note: could not publish the 'Sluice Job Cancelled' event ({exc})")


def _failed_lines(dep: Deployment, key: str, codes: set[str] | None) -> tuple[dict[int, str | None], dict[str, int]]:
    """Line → custom_id of the errors worth retrying (None for a line too broken to have one);
    and the count of those skipped, by code."""
    from sluice.lines import split_lines

    body = dep.s3.get_object(Bucket=dep.bucket, Key=key)["Body"]
    picked: dict[int, str | None] = {}
    skipped: dict[str, int] = {}
    for raw in split_lines(body.iter_chunks(READ_CHUNK)):
        if not raw.strip():
            continue
        record = orjson.loads(raw)
        code = str((record.get("error") or {}).get("code", ""))
        wanted = code in codes if codes is not None else code not in INPUT_ERROR_CODES
        if wanted and record.get("line") is not None:
            picked[int(record["line"])] = record.get("custom_id")
        else:
            skipped[code] = skipped.get(code, 0) + 1
    return picked, skipped


def _retry_key(dep: Deployment, key: str) -> str:
    base = _RETRY_SUFFIX.sub("", key.removesuffix(".jsonl"))
    used = [0]
    for page in dep.s3.get_paginator("list_objects_v2").paginate(Bucket=dep.bucket, Prefix=base + ".retry-"):
        for obj in page.get("Contents", []):
            match = re.fullmatch(re.escape(base) + r"\.retry-(\d+)\.jsonl", obj["Key"])
            if match:
                used.append(int(match.group(1)))
    return f"{base}.retry-{max(used) + 1}.jsonl"


def _carried_metadata(dep: Deployment, job: dict[str, Any]) -> dict[str, str]:
    """The parent's options (mode, model, ...), so the retry runs the way the original did."""
    from botocore.exceptions import ClientError

    try:
        head = dep.s3.head_object(Bucket=job["bucket"], Key=job["key"])
    except ClientError:
        return {}
    return {k: v for k, v in head.get("Metadata", {}).items() if k.startswith("sluice-") and k != "sluice-parent-job"}


def retry(args: argparse.Namespace) -> int:
    from sluice.plan import output_prefix

    dep = deployment(args)
    job = job_or_fail(dep, args.job)
    if job.get("status") not in TERMINAL:
        raise CliError(f"job {args.job} is {job.get('status')}: retry it once it has ended", EXIT_NOT_READY)
    errors_key = output_prefix(str(job["key"])) + ".errors.jsonl"
    if _size(dep, errors_key) is None:
        raise CliError(f"job {args.job} has no errors file (s3://{dep.bucket}/{errors_key})", EXIT_NOT_FOUND)
    picked, skipped = _failed_lines(dep, errors_key, set(args.code) if args.code else None)
    for code, n in sorted(skipped.items()):
        reason = (
            "invalid input: fix the lines and submit them again"
            if code in INPUT_ERROR_CODES
            else "not selected by --code"
        )
        say(f"  not retried: {n} line(s) with {code} ({reason})")
    if not picked:
        say(f"job {args.job}: no failed lines to retry")
        return EXIT_OK
    chunks = _local_chunks(need_file(Path(args.input))) if args.input else _input_chunks(dep, job)
    metadata = {**_carried_metadata(dep, job), **options_metadata(args), "sluice-parent-job": args.job}
    with tempfile.TemporaryDirectory(prefix="sluice-retry-") as tmp:
        path = Path(tmp) / "retry.jsonl"
        _write_lines(chunks, picked, path)
        key = _retry_key(dep, str(job["key"]))
        new_id = _start(dep, path, key, metadata, quiet=args.quiet, what=f"{len(picked):,} failed lines of {args.job}")
    print(new_id, flush=True)
    if args.watch:
        return watch(dep, new_id, interval=args.interval, quiet=args.quiet)
    return EXIT_OK


def _write_lines(chunks: Iterator[bytes], picked: dict[int, str | None], path: Path) -> None:
    """Copy the picked input lines, byte for byte, checking each is the request the error named."""
    from sluice.lines import parse_line, split_lines

    left = dict(picked)
    with path.open("wb") as out:
        for number, raw in enumerate(split_lines(chunks), start=1):
            if number not in left:
                continue
            parsed = parse_line(raw, number, keep_body=False)
            custom_id = getattr(parsed, "custom_id", None)
            if custom_id != left[number]:
                raise CliError(
                    f"line {number} of the input holds custom_id {custom_id!r}, the errors file says {left[number]!r}: "
                    "is this the file the job ran?",
                    EXIT_INPUT,
                )
            out.write(raw if raw.endswith(b"\n") else raw + b"\n")
            del left[number]
            if not left:
                break
    if left:
        raise CliError(
            f"the input has no line(s) {', '.join(map(str, sorted(left)[:5]))}: is this the file the job ran?",
            EXIT_INPUT,
        )


def add_env_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        default=os.environ.get("SLUICE_ENV", "dev"),
        help="environment: the CloudFormation stack Sluice-<env> (default: $SLUICE_ENV or dev)",
    )
    parser.add_argument("--region", help="AWS region (default: your AWS configuration)")
    parser.add_argument("--profile", help="AWS profile (default: your AWS configuration)")
