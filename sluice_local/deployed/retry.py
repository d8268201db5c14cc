"""A new job from a finished job's failed lines: which to take, copied byte for byte, and
under which name."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import orjson
from botocore.exceptions import ClientError
from sluice.contract import METADATA_PREFIX, JobRow, job_option_key
from sluice.formats.lines import READ_CHUNK, parse_line, split_lines

from sluice_local.console import EXIT_INPUT, CliError
from sluice_local.deployed.stack import Deployment

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
        "unsupported_field",
        "line_too_large",
        "invalid_encoding",
    }
)
_RETRY_SUFFIX = re.compile(r"\.retry-\d+$")


def failed_lines(dep: Deployment, key: str, codes: set[str] | None) -> tuple[dict[int, str | None], dict[str, int]]:
    """Line → custom_id of the errors worth retrying (None for a line too broken to have one);
    and the count of those skipped, by code."""
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


def retry_key(dep: Deployment, key: str) -> str:
    """inbox/<name>.retry-<n>.jsonl, with n one more than any retry of the same input so far."""
    base = _RETRY_SUFFIX.sub("", key.removesuffix(".jsonl"))
    used = [0]
    for page in dep.s3.get_paginator("list_objects_v2").paginate(Bucket=dep.bucket, Prefix=base + ".retry-"):
        for obj in page.get("Contents", []):
            match = re.fullmatch(re.escape(base) + r"\.retry-(\d+)\.jsonl", obj["Key"])
            if match:
                used.append(int(match.group(1)))
    return f"{base}.retry-{max(used) + 1}.jsonl"


def carried_metadata(dep: Deployment, job: JobRow) -> dict[str, str]:
    """The parent's options (mode, model, ...), so the retry runs the way the original did."""
    try:
        head = dep.s3.head_object(Bucket=job.bucket, Key=job.key)
    except ClientError:
        return {}
    return {
        k: v
        for k, v in head.get("Metadata", {}).items()
        if k.startswith(METADATA_PREFIX) and k != job_option_key("parent-job")
    }


def write_lines(chunks: Iterator[bytes], picked: dict[int, str | None], path: Path) -> None:
    """Copy the picked input lines, byte for byte, checking each is the request the error named."""
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
