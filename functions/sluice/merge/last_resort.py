"""MarkFailed's last resort: when accounting for a failed job's lines from its shards' outputs
failed too, every line is accounted for from the input alone, by a path that shares nothing with
the one that failed (no parts, no assembly, no concatenation: the input read by its shards' ranges
and one streamed upload through boto3's transfer manager)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from typing import Any

from boto3.s3.transfer import TransferConfig

from sluice.contract import JobStatus, Planned, Summary, causes
from sluice.contract.layout import OUTPUT_SUFFIXES, job_prefix, output_key
from sluice.contract.model import ErrorCode
from sluice.contract.summary import Counts
from sluice.core.records import error_record
from sluice.formats.lines import LineError
from sluice.merge.merge import load_manifest
from sluice.merge.summary import Tally, end_job, job_figures
from sluice.shard.frame import read_shard_lines
from sluice.shard.stats import Stats

# pieces of the streamed upload, and how many go up at once: what the step holds of the file
PIECE_BYTES = 8 << 20
TRANSFER = TransferConfig(multipart_chunksize=PIECE_BYTES, multipart_threshold=PIECE_BYTES, max_concurrency=4)


class _Stream(io.RawIOBase):
    """The records as a file the transfer manager reads piece by piece, never whole."""

    def __init__(self, records: Iterator[bytes]) -> None:
        self._records = records
        self._held = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._held:
            record = next(self._records, None)
            if record is None:
                return 0
            self._held = record
        size = min(len(buffer), len(self._held))
        buffer[:size] = self._held[:size]
        self._held = self._held[size:]
        return size


def account_from_input(s3: Any, store: Any, state: Planned, reason: str, *, clock: Any = time.time) -> Summary:
    """Write the job's outputs with every request line in errors: a line Plan found invalid as it
    found it, every other `job_failed` naming `reason`. An answer the provider gave for a line is
    not read back here (that is the path that failed), and the message says where it may be."""
    bucket, job_id, prefix = state.bucket, state.job_id, state.output_prefix
    specs = load_manifest(s3, bucket, state.manifest_key)
    stats = Stats()
    message = (
        f"the job failed before this line's outcome was written, and its outputs could not be assembled ({reason}); "
        f"an answer the provider gave is kept under s3://{bucket}/{job_prefix(job_id)}"
    )

    def records() -> Iterator[bytes]:
        for spec in specs:
            # a shard's byte range of the input: the last resort's reads grow with the shards
            with causes.because(causes.SHARD_OUTPUTS):
                lines = list(read_shard_lines(s3, spec))
            for item in lines:
                if isinstance(item, LineError):
                    code, text = item.code, item.message
                else:
                    code, text = ErrorCode.JOB_FAILED, f"line {item.line}: {message}"
                stats.add_error(code, text)
                yield error_record(job_id, item.line, item.custom_id, code, text) + b"\n"

    with causes.because(causes.MARK_FAILED):
        s3.upload_fileobj(
            io.BufferedReader(_Stream(records()), PIECE_BYTES),
            bucket,
            output_key(prefix, "errors"),
            ExtraArgs={"ContentType": "application/jsonl"},
            Config=TRANSFER,
        )
        s3.put_object(Bucket=bucket, Key=output_key(prefix, "results"), Body=b"", ContentType="application/jsonl")
    job = store.job(job_id)
    plan = job.plan if job else None
    lines = plan.lines if plan else sum(s.lines for s in specs)
    blank = plan.blank if plan else sum(s.blank for s in specs)
    # every line written was counted as an error on the way
    written = sum(stats.errors.values())
    counts = Counts(lines=lines, blank=blank, requests=written, results=0, errors=written)
    started = float(job.started_at) if job else float(clock())
    figures = job_figures(
        Tally(totals=stats, error_lines=written),
        counts=counts,
        outputs={kind: f"s3://{bucket}/{output_key(prefix, kind)}" for kind in OUTPUT_SUFFIXES},
        moved={"requests": 0, "bytes_copied": 0, "bytes_through": 0},
        job=job,
        max_error_rate=float(plan.max_error_rate) if plan else 0.0,
        started=started,
        wall=round(clock() - started, 3),
    )
    summary = Summary(
        job_id=job_id, status=JobStatus.FAILED, input=f"s3://{bucket}/{state.key}", figures=figures, error=reason
    )
    end_job(s3, store, summary, bucket=bucket, prefix=prefix)
    return summary
