"""Starting a job on a deployed environment: an upload to its inbox, with the job's options as
object metadata; the S3 event starts it."""

from __future__ import annotations

import argparse
from pathlib import Path

from sluice.contract import DEFAULT_PROVIDER, INBOX_PREFIX, JOB_OPTIONS, METADATA_PREFIX, Settings, job_option_key
from sluice.plan.plan import JobOptions, PlanError, job_id_for

from sluice_local.cli.validate_options import validate_metadata
from sluice_local.console import EXIT_USAGE, CliError, progress, say
from sluice_local.deployed.stack import Deployment

# the job options as `sluice submit` and `sluice retry` name their arguments (`--budget` is `budget_usd`)
OPTION_NAMES = tuple(option.replace("-", "_") for option in JOB_OPTIONS)
# the validation options, whose arguments are not their metadata's values (a schema is a local file)
_VALIDATE_NAMES = frozenset({"validate", "validate_attempts", "validate_repair", "validate_schema"})


def options_metadata(args: argparse.Namespace) -> dict[str, str]:
    """The job options as the object metadata Plan reads, checked by Plan's own rules first, as
    an environment of the provider family the job names (or OpenAI's) would check them."""
    metadata: dict[str, str] = {}
    for name in OPTION_NAMES:
        value = getattr(args, name, None)
        if value is not None and name not in _VALIDATE_NAMES:
            metadata[job_option_key(name)] = str(value)
    metadata.update(validate_metadata(args))
    check_options(metadata, getattr(args, "provider", None) or DEFAULT_PROVIDER)
    return metadata


def check_options(metadata: dict[str, str], provider: str) -> None:
    """Refuse what Plan would refuse in an environment of the family `provider`: a bad option,
    a mode the family has no API for, a job naming another family."""
    settings = Settings(bucket="-", table="-", provider_base_url="-", api_key_secret_arn="-", provider=provider)
    try:
        JobOptions.from_metadata(metadata, settings)
    except PlanError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc


def inbox_key(name: str) -> str:
    """inbox/<name>.jsonl: the EventBridge rule only starts jobs for `.jsonl` keys under inbox/."""
    name = name.strip("/").removeprefix(INBOX_PREFIX)
    if not name or name.startswith("."):
        raise CliError(f"bad object name {name!r}", EXIT_USAGE)
    return INBOX_PREFIX + (name if name.endswith(".jsonl") else name + ".jsonl")


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


def start_job(dep: Deployment, path: Path, key: str, metadata: dict[str, str], *, quiet: bool, what: str) -> str:
    """Upload `path` as `key`; the id of the job its S3 event starts (or started, for content seen before)."""
    etag = upload(dep, path, key, metadata, quiet=quiet)
    job_id = job_id_for(dep.bucket, key, etag)
    existing = dep.store.job(job_id)
    if existing is not None:
        say(
            f"s3://{dep.bucket}/{key} has exactly this content already: job {job_id} is {existing.status} "
            "and will not run again (upload changed content to start a new job)"
        )
    else:
        options = (
            ", ".join(f"{k.removeprefix(METADATA_PREFIX)}={v}" for k, v in metadata.items()) or "environment defaults"
        )
        say(f"uploaded {path} ({what}) to s3://{dep.bucket}/{key} [{options}]; the job starts from the S3 event")
        say(f"follow it with: sluice status {job_id} --env {dep.env} --watch")
    return job_id
