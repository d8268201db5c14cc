"""Merge: shard outputs → one results object, one errors object and a summary, in input order.

Large outputs are stitched server-side with multipart `UploadPartCopy`, so their bytes never
pass through the Lambda; only the seams between small shard files are downloaded.
"""

from __future__ import annotations

import logging
import mmap
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from botocore.exceptions import ClientError

from sluice.contract import (
    DEFAULT_PROVIDER,
    OUTPUT_SUFFIXES,
    Counts,
    JobStatus,
    PlanFigures,
    Planned,
    Settings,
    ShardSpec,
    Summary,
    causes,
    output_key,
)
from sluice.contract.model import ErrorCode
from sluice.merge.outputs import OutOfTime, shard_outputs
from sluice.merge.summary import InvariantError, Tally, end_job, job_figures, with_deadline
from sluice.plan.turnarounds import keep_turnarounds
from sluice.shard.parts import s3_pool
from sluice.store.jobs import JobStore

MIN_PART = 5 << 20
MAX_PART = 5 << 30
# Parts that pass through the process (read, then uploaded) in flight at once. Each holds up to
# 2 * MIN_PART bytes, so this, not the job's size or S3_IN_FLIGHT, bounds what a concatenation
# holds: ten of them, each read and then joined into a copy, held 150 MB above the step's imports.
# Copied parts hold nothing and go S3_IN_FLIGHT at a time beside them.
THROUGH_IN_FLIGHT = 3
# a piece is read into its part's buffer this many bytes at a time (urllib3 reads each into a
# temporary of that size first)
READ_CHUNK = 1 << 20

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deadlines:
    """When a MarkFailed call stops (`time.monotonic()`): it starts assembling no shard after
    `assemble`, and once it has assembled any it merges only before `merge`."""

    assemble: float
    merge: float


@dataclass(frozen=True)
class Piece:
    source: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Part:
    """One multipart part: a single piece copied server-side, or pieces uploaded together."""

    pieces: tuple[Piece, ...]
    copy: bool

    @property
    def size(self) -> int:
        return sum(p.size for p in self.pieces)


def plan_parts(sizes: list[int], *, min_part: int = MIN_PART, max_part: int = MAX_PART) -> list[Part]:
    """Cut the concatenation of `sizes` into parts of at least `min_part` (except the last).

    A source with `min_part` bytes or more to spare is copied server-side; small sources are
    combined, borrowing the head of the next source when a group falls short, so at most
    `2 * min_part` bytes per seam pass through the process.
    """
    parts: list[Part] = []
    group: list[Piece] = []
    grouped = 0
    for index, size in enumerate(sizes):
        pos = 0
        if size <= 0:
            continue
        if grouped:
            take = min(min_part - grouped, size)
            if 0 < size - take < min_part:
                # a stub too short to copy on its own would start another seam: take it all now
                take = size
            group.append(Piece(index, 0, take))
            grouped += take
            pos = take
            if grouped >= min_part:
                parts.append(Part(tuple(group), copy=False))
                group, grouped = [], 0
        rest = size - pos
        if rest >= min_part:
            while rest > 0:
                chunk = min(rest, max_part)
                if 0 < rest - chunk < min_part:
                    chunk = rest - min_part
                parts.append(Part((Piece(index, pos, pos + chunk),), copy=True))
                pos += chunk
                rest -= chunk
        elif rest > 0:
            group.append(Piece(index, pos, size))
            grouped += rest
    if group:
        parts.append(Part(tuple(group), copy=False))
    return parts


@contextmanager
def _read_pieces(s3: Any, bucket: str, sources: list[str], pieces: tuple[Piece, ...]) -> Iterator[mmap.mmap | bytes]:
    """The pieces, in order, read straight into one buffer, and let go when the block ends.

    The buffer is a mapping of its own, not the heap's: malloc keeps freed blocks of this size in
    each thread's arena, so parts read on ten threads held ten of them resident after they were sent."""
    size = sum(p.size for p in pieces)
    if not size:
        yield b""
        return
    with mmap.mmap(-1, size) as body:
        at = 0
        with memoryview(body) as view:
            for piece in pieces:
                # a shard's output read again, to be concatenated: its shard's, counted where its figures were read
                with causes.because(causes.SHARD_OUTPUTS, count=0):
                    answer = s3.get_object(
                        Bucket=bucket, Key=sources[piece.source], Range=f"bytes={piece.start}-{piece.end - 1}"
                    )
                stream, end = answer["Body"], at + piece.size
                while at < end:
                    with view[at : min(end, at + READ_CHUNK)] as chunk:
                        read = stream.readinto(chunk)
                    if not read:
                        break
                    at += read
                # to its end, which is where botocore checks the length and the connection goes back to the pool
                stream.read()
            if at < size:
                # a source shorter than its size says: what it holds, as the ranges read would have given
                yield bytes(view[:at])
                return
        yield body


def concatenate(
    s3: Any, bucket: str, sources: list[str], target: str, *, content_type: str, sizes: list[int | None] | None = None
) -> dict[str, int]:
    """Write the sources, in order, as one object. Returns the request and byte counts.

    `sizes`, where known, spare a HEAD of each source."""
    known = sizes or [None] * len(sources)
    lengths = [
        int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"]) if size is None else size
        for key, size in zip(sources, known, strict=True)
    ]
    parts = plan_parts(lengths)
    heads = sum(1 for size in known if size is None)
    moved = {"requests": heads, "bytes_through": 0, "bytes_copied": 0, "parts": len(parts)}
    if len(parts) == 1 and parts[0].copy:
        # the parts cover every byte, so one copied part is the one non-empty source, whole (a
        # shard the response cache answered whole, say): copied server-side
        (piece,) = parts[0].pieces
        s3.copy_object(
            Bucket=bucket,
            Key=target,
            CopySource={"Bucket": bucket, "Key": sources[piece.source]},
            ContentType=content_type,
            MetadataDirective="REPLACE",
        )
        moved["requests"] += 1
        moved["bytes_copied"] = piece.size
        return moved
    if len(parts) <= 1:
        with _read_pieces(s3, bucket, sources, tuple(p for part in parts for p in part.pieces)) as body:
            s3.put_object(Bucket=bucket, Key=target, Body=body, ContentType=content_type)
            moved["bytes_through"] = len(body)
        moved["requests"] += 1 + sum(len(part.pieces) for part in parts)
        return moved
    upload = s3.create_multipart_upload(Bucket=bucket, Key=target, ContentType=content_type)
    upload_id = upload["UploadId"]

    def put(number: int, part: Part) -> tuple[str, dict[str, int]]:
        if part.copy:
            piece = part.pieces[0]
            answer = s3.upload_part_copy(
                Bucket=bucket,
                Key=target,
                UploadId=upload_id,
                PartNumber=number,
                CopySource={"Bucket": bucket, "Key": sources[piece.source]},
                CopySourceRange=f"bytes={piece.start}-{piece.end - 1}",
            )
            return answer["CopyPartResult"]["ETag"], {"requests": 1, "bytes_copied": piece.size}
        with through, _read_pieces(s3, bucket, sources, part.pieces) as body:
            answer = s3.upload_part(Bucket=bucket, Key=target, UploadId=upload_id, PartNumber=number, Body=body)
            size = len(body)
        return answer["ETag"], {"requests": 1 + len(part.pieces), "bytes_through": size}

    through = threading.BoundedSemaphore(THROUGH_IN_FLIGHT)
    try:
        # the parts at once, S3_IN_FLIGHT at a time, of them THROUGH_IN_FLIGHT read and uploaded
        with s3_pool() as pool:
            answers = list(pool.map(put, range(1, len(parts) + 1), parts))
        s3.complete_multipart_upload(
            Bucket=bucket,
            Key=target,
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n} for n, (e, _) in enumerate(answers, start=1)]},
        )
        moved["requests"] += 2
    except BaseException:
        s3.abort_multipart_upload(Bucket=bucket, Key=target, UploadId=upload_id)
        raise
    for _, counts in answers:
        for name, value in counts.items():
            moved[name] += value
    return moved


@causes.under(causes.MERGE, causes.MARK_FAILED)
def load_manifest(s3: Any, bucket: str, manifest_key: str) -> list[ShardSpec]:
    raw = s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read()
    return [ShardSpec.from_dict(item) for item in orjson.loads(raw)]


def outcome_status(errors: int, requests: int, max_error_rate: float, *, failed_shards: bool = False) -> str:
    """SUCCEEDED, or COMPLETED_WITH_ERRORS when failed lines pass the job's threshold.

    Strictly more than the allowed share: with 0, one failed line is enough; with 1, never.
    The product is rounded so that 29 of 100 is within 0.29 (0.29 * 100 is 28.999999999999996).
    A job with `failed_shards` never SUCCEEDED: within the threshold it COMPLETED_WITH_ERRORS, past
    it FAILED.
    """
    over = bool(errors) and errors > round(max_error_rate * requests, 6)
    if failed_shards:
        return JobStatus.FAILED if over else JobStatus.COMPLETED_WITH_ERRORS
    return JobStatus.COMPLETED_WITH_ERRORS if over else JobStatus.SUCCEEDED


def shard_failures(tally: Tally) -> str | None:
    """What the job's failed shards say of why, or None when none failed."""
    failed = [shard for shard in tally.shards if shard.failure]
    if not failed:
        return None
    lines = tally.totals.errors.get(ErrorCode.SHARD_FAILED, 0)
    first = failed[0]
    return (
        f"{len(failed):,} shard(s) failed after their retries ({lines:,} unfinished lines went to the errors as "
        f"{ErrorCode.SHARD_FAILED}); shard {first.shard} (lines {first.first_line:,}-"
        f"{first.first_line + first.lines - 1:,}): {first.failure}"
    )


def _tally(
    s3: Any, specs: list[ShardSpec], *, missing_code: str | None, missing_message: str, deadlines: Deadlines | None
) -> Tally:
    """Every shard's output counted in; with `missing_code`, the ones that never finished
    assembled first, within `deadlines`, else OutOfTime."""
    tally = Tally()
    outputs = shard_outputs(
        s3,
        specs,
        missing_code=missing_code,
        missing_message=missing_message,
        deadline=None if deadlines is None else deadlines.assemble,
    )
    for output in outputs:
        tally.add(s3, output)
    if tally.assembled and deadlines is not None and time.monotonic() > deadlines.merge:
        # a call that assembled a great deal does not merge a large job too: the next one finds
        # every shard finished and merges from a fresh clock
        raise OutOfTime(0)
    return tally


def _write_outputs(s3: Any, bucket: str, prefix: str, specs: list[ShardSpec], tally: Tally) -> dict[str, int]:
    """The shards' results, then their errors, each concatenated into the job's output in input
    order. Returns what the results took (requests and bytes)."""
    moved = concatenate(
        s3,
        bucket,
        [s.results_key for s in specs],
        output_key(prefix, "results"),
        content_type="application/jsonl",
        sizes=tally.result_sizes,
    )
    concatenate(
        s3,
        bucket,
        [s.errors_key for s in specs],
        output_key(prefix, "errors"),
        content_type="application/jsonl",
        sizes=tally.error_sizes,
    )
    return moved


def _counts(plan: PlanFigures | None, specs: list[ShardSpec], tally: Tally) -> Counts:
    """The job's lines as Plan counted them (as its shards did, with no plan on the row), each
    request a result or an error, else InvariantError."""
    lines = plan.lines if plan else sum(s.lines for s in specs)
    blank = plan.blank if plan else sum(s.blank for s in specs)
    if tally.result_lines + tally.error_lines != lines - blank:
        raise InvariantError(
            f"outputs hold {tally.result_lines + tally.error_lines} lines; the input has {lines - blank} requests"
        )
    return Counts(
        lines=lines, blank=blank, requests=lines - blank, results=tally.result_lines, errors=tally.error_lines
    )


@causes.under(causes.MERGE)
def merge_job(
    *,
    s3: Any,
    store: JobStore,
    state: Planned,
    status: str | None = None,
    missing_code: str | None = None,
    missing_message: str = "",
    error: str | None = None,
    clock: Any = time.time,
    deadlines: Deadlines | None = None,
    settings: Settings | None = None,
) -> Summary:
    """Write the job's outputs and summary; raise InvariantError if any line is unaccounted for.

    With `missing_code`, shards that never finished are assembled first (see `shard_outputs`),
    within `deadlines`, else OutOfTime. With `settings` (Merge's own call), the turnarounds of the
    job's completed batches are kept for later jobs' deadline plans (`keep_measured`)."""
    bucket, job_id, prefix = state.bucket, state.job_id, state.output_prefix
    # a newer upload of the key runs as `owner`: the key's outbox names are its job's outputs, and
    # this job's go beside them under names of its own (`sluice.store.input_rows`)
    prefix, owner = store.outputs_prefix(bucket, state.key, job_id, prefix)
    if owner is not None:
        error = error or f"superseded: s3://{bucket}/{state.key} was uploaded again and runs as job {owner}"
    specs = load_manifest(s3, bucket, state.manifest_key)
    job = store.job(job_id)
    plan = job.plan if job else None
    tally = _tally(s3, specs, missing_code=missing_code, missing_message=missing_message, deadlines=deadlines)
    moved = _write_outputs(s3, bucket, prefix, specs, tally)
    counts = _counts(plan, specs, tally)
    started = float(job.started_at) if job else float(clock())
    wall = round(clock() - started, 3)
    max_error_rate = float(plan.max_error_rate) if plan else 0.0
    failed_shards = shard_failures(tally)
    if status is None:
        status = (
            JobStatus.BUDGET_EXCEEDED
            if tally.unsent
            else outcome_status(counts.errors, counts.requests, max_error_rate, failed_shards=bool(failed_shards))
        )
    if failed_shards and error is None:
        error = failed_shards
    figures = job_figures(
        tally,
        counts=counts,
        outputs={kind: f"s3://{bucket}/{output_key(prefix, kind)}" for kind in OUTPUT_SUFFIXES},
        moved=moved,
        job=job,
        max_error_rate=max_error_rate,
        started=started,
        wall=wall,
    )
    figures = with_deadline(s3, bucket, job_id, specs, figures, clock(), flex_fallback=tally.totals.tier_fallback)
    summary = Summary(job_id=job_id, status=status, input=f"s3://{bucket}/{state.key}", figures=figures, error=error)
    end_job(s3, store, summary, bucket=bucket, prefix=prefix)
    if settings is not None and tally.measured:
        keep_measured(s3, bucket, settings, tally.measured)
    return summary


def keep_measured(s3: Any, bucket: str, settings: Settings, measured: Mapping[str | None, list[float]]) -> None:
    """The job's measured turnarounds added to each model's object (a batch whose row named no model
    ran the environment's default). After the summary, and never failing the merge: the job has
    ended as it did, and a figure lost only leaves a later plan one fewer to read."""
    by_model: dict[str, list[float]] = {}
    for model, figures in measured.items():
        name = model or settings.default_model
        if name:
            by_model.setdefault(name, []).extend(figures)
    try:
        keep_turnarounds(s3, bucket, settings.provider or DEFAULT_PROVIDER, by_model)
    except ClientError as exc:
        logger.warning("the job's batch turnarounds were not kept: %s", exc)
