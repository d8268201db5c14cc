"""A deployed job's lines: its input, streamed as the job ran it, and where one line ended."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from botocore.exceptions import ClientError
from sluice.contract import JobRow, manifest_key
from sluice.formats.lines import READ_CHUNK, LineError, parse_line, split_lines
from sluice.merge.merge import load_manifest
from sluice.shard.frame import ShardSpec, read_shard_lines

# the checkpoint format belongs to the shard code; its own readers keep the two in step
from sluice.shard.parts import part_keys, read_part

from sluice_local.console import EXIT_NOT_FOUND, CliError
from sluice_local.deployed.jobs import output_size
from sluice_local.deployed.stack import Deployment, error_code


def local_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while chunk := fh.read(READ_CHUNK):
            yield chunk


def input_pin(dep: Deployment, job: JobRow) -> dict[str, str]:
    """What names the very input object the job ran: the VersionId Plan recorded in its shard specs
    (a versioned bucket, where the key may hold newer content since), else its ETag. A job still
    planning has no specs yet, and is read by its ETag."""
    try:
        specs = load_manifest(dep.s3, job.bucket, manifest_key(job.job_id))
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404"):
            return {"IfMatch": job.etag}
        raise
    return specs[0].pin if specs else {"IfMatch": job.etag}


def input_chunks(dep: Deployment, job: JobRow) -> Iterator[bytes]:
    """The job's input object, exactly the version the job ran (`input_pin`), streamed."""
    try:
        body = dep.s3.get_object(Bucket=job.bucket, Key=job.key, **input_pin(dep, job))["Body"]
    except ClientError as exc:
        if error_code(exc) in ("PreconditionFailed", "412", "NoSuchKey", "NoSuchVersion", "404"):
            raise CliError(
                f"s3://{job.bucket}/{job.key} is gone or changed since job {job.job_id} ran; "
                "pass --input FILE with the original file",
                EXIT_NOT_FOUND,
            ) from exc
        raise
    yield from body.iter_chunks(READ_CHUNK)


def find_in_lines(chunks: Iterator[bytes], custom_id: str) -> tuple[int, Any] | None:
    """(line number, parse result) of the first line whose custom_id matches."""
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


def answered_outcome(dep: Deployment, spec: ShardSpec, line: int) -> tuple[int, dict[str, Any]] | None:
    """A line of a shard Plan answered from the cache: it has no parts, only its results, by custom_id."""
    custom_id = next((r.custom_id for r in read_shard_lines(dep.s3, spec) if r.line == line), None)
    if custom_id is None:
        return None
    record = _first_record(dep, spec.bucket, spec.results_key, "custom_id", custom_id)
    return None if record is None else (spec.shard, record)


def _first_record(dep: Deployment, bucket: str, key: str, field: str, value: Any) -> dict[str, Any] | None:
    """The first line of a JSONL object whose `field` is `value`."""
    body = dep.s3.get_object(Bucket=bucket, Key=key)["Body"]
    for raw in split_lines(body.iter_chunks(READ_CHUNK)):
        record = orjson.loads(raw)
        if record.get(field) == value:
            return dict(record)
    return None


def line_outcome(dep: Deployment, job: JobRow, line: int) -> tuple[int, dict[str, Any]] | None:
    """(shard, output record) of a line that has a terminal outcome, from its shard's checkpoints.

    Direct mode keeps no item row for a success, so this is where a finished line is found.
    """
    try:
        specs = load_manifest(dep.s3, job.bucket, manifest_key(job.job_id))
    except ClientError as exc:
        if error_code(exc) in ("NoSuchKey", "404"):
            return None  # still planning
        raise
    spec = next((s for s in specs if s.first_line <= line <= s.last_line), None)
    if spec is None:
        return None
    if spec.answered:
        return answered_outcome(dep, spec, line)
    for key in part_keys(dep.s3, spec):
        for number, _kind, record in read_part(dep.s3, spec.bucket, key):
            if number == line:
                return spec.shard, dict(orjson.loads(record))
    # lines a failed or cancelled job never finished are written when the shard is assembled
    if output_size(dep, spec.errors_key) is not None:
        failed = _first_record(dep, spec.bucket, spec.errors_key, "line", line)
        if failed is not None:
            return spec.shard, failed
    return None
