"""Merge: shard outputs → one results object, one errors object and a summary, in input order.

Large outputs are stitched server-side with multipart `UploadPartCopy`, so their bytes never
pass through the Lambda; only the seams between small shard files are downloaded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import orjson

from .budget import nano_to_usd
from .contract import OUTPUT_SUFFIXES, PROVIDER_REFUSED, JobStatus, ProviderRefused, output_key
from .costs import aws_cost_usd, provider_cost_usd
from .model import ErrorCode
from .outputs import OutOfTime, shard_outputs
from .parts import s3_pool
from .refusal import read_refusal
from .shard import ShardSpec
from .stats import Stats
from .store import JobStore

MIN_PART = 5 << 20
MAX_PART = 5 << 30


class InvariantError(RuntimeError):
    """The outputs do not account for every input line exactly once; the job must not succeed."""


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


def _read_range(s3: Any, bucket: str, key: str, piece: Piece) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={piece.start}-{piece.end - 1}")["Body"].read())


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
        body = b"".join(_read_range(s3, bucket, sources[p.source], p) for part in parts for p in part.pieces)
        s3.put_object(Bucket=bucket, Key=target, Body=body, ContentType=content_type)
        moved["requests"] += 1 + sum(len(part.pieces) for part in parts)
        moved["bytes_through"] = len(body)
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
        body = b"".join(_read_range(s3, bucket, sources[p.source], p) for p in part.pieces)
        answer = s3.upload_part(Bucket=bucket, Key=target, UploadId=upload_id, PartNumber=number, Body=body)
        return answer["ETag"], {"requests": 1 + len(part.pieces), "bytes_through": len(body)}

    try:
        # the parts at once, S3_IN_FLIGHT at a time: one holds at most 2 * MIN_PART bytes while it is sent
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


def load_manifest(s3: Any, bucket: str, manifest_key: str) -> list[ShardSpec]:
    raw = s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read()
    return [ShardSpec.from_dict(item) for item in orjson.loads(raw)]


def provider_costs(models: dict[str, list[int]], batch_models: dict[str, list[int]]) -> dict[str, float | None]:
    """The provider estimate as run (rows a batch answered at the batch rate, the rest direct)
    next to what the same tokens cost all direct and all batch."""
    direct_models = {
        model: [max(0, t - b) for t, b in zip(tokens, batch_models.get(model, [0, 0]), strict=True)]
        for model, tokens in models.items()
    }
    direct = provider_cost_usd(direct_models)
    batched = provider_cost_usd(batch_models, batch=True)
    as_run = None if direct is None and batched is None else round((direct or 0.0) + (batched or 0.0), 6)
    return {
        "as_run": as_run,
        "all_direct": provider_cost_usd(models),
        "all_batch": provider_cost_usd(models, batch=True),
    }


def _provider_summary(costs: dict[str, float | None]) -> dict[str, float | None]:
    as_run, all_direct = costs["as_run"], costs["all_direct"]
    return {
        "provider": as_run,
        "provider_all_direct": all_direct,
        "provider_all_batch": costs["all_batch"],
        # what batching saved against sending everything directly
        "batch_savings": None if as_run is None or all_direct is None else round(all_direct - as_run, 6),
    }


def _saved_usd(direct_hits: Stats, batch_hits: Stats) -> float | None:
    """What the hits would have cost this job: at the Batch API's rate in a shard that batches
    (a batch job's re-run saves what the batch cost), at the direct rate in any other."""
    direct = provider_cost_usd(direct_hits.cached_models)
    batch = provider_cost_usd(batch_hits.cached_models, batch=True)
    if direct is None and batch is None:
        return None
    return round((direct or 0.0) + (batch or 0.0), 6)


def outcome_status(errors: int, requests: int, max_error_rate: float) -> str:
    """SUCCEEDED, or COMPLETED_WITH_ERRORS when failed lines pass the job's threshold.

    Strictly more than the allowed share: with 0, one failed line is enough; with 1, never.
    The product is rounded so that 29 of 100 is within 0.29 (0.29 * 100 is 28.999999999999996).
    """
    if errors and errors > round(max_error_rate * requests, 6):
        return JobStatus.COMPLETED_WITH_ERRORS
    return JobStatus.SUCCEEDED


def merge_job(
    *,
    s3: Any,
    store: JobStore,
    state: dict[str, Any],
    status: str | None = None,
    missing_code: str | None = None,
    missing_message: str = "",
    error: str | None = None,
    clock: Any = time.time,
    deadlines: Deadlines | None = None,
) -> dict[str, Any]:
    """Write the job's outputs and summary; raise InvariantError if any line is unaccounted for.

    With `missing_code`, shards that never finished are assembled first (see `shard_outputs`),
    within `deadlines`, else OutOfTime."""
    bucket, job_id = state["bucket"], state["job_id"]
    specs = load_manifest(s3, bucket, state["manifest_key"])
    job = store.job(job_id) or {}
    plan = job.get("plan", {})
    totals = Stats()
    batch_totals = Stats()
    # the tokens the cache answered, by the rate their shard would have paid to send them
    direct_hits, batch_hits = Stats(), Stats()
    shards = []
    result_lines = error_lines = 0
    # what each shard wrote, by the size its stats give (none before they carried one)
    result_sizes: list[int | None] = []
    error_sizes: list[int | None] = []
    # what the first shard a refusing provider stopped says of it (one note read, not one a shard)
    refused: ProviderRefused | None = None
    assembled = 0
    outputs = shard_outputs(
        s3,
        specs,
        missing_code=missing_code,
        missing_message=missing_message,
        deadline=None if deadlines is None else deadlines.assemble,
    )
    for output in outputs:
        spec, shard_stats, report = output.spec, output.figures, output.report
        assembled += output.assembled
        stats = Stats.from_dict(shard_stats["stats"])
        totals.merge(stats)
        if refused is None and stats.errors.get(ErrorCode.PROVIDER_REFUSED):
            refused = read_refusal(s3, spec.bucket, spec.refusal_key)
        (batch_hits if spec.mode == "batch" else direct_hits).merge(Stats(cached_models=stats.cached_models))
        expected = spec.lines - spec.blank
        got = shard_stats["result_lines"] + shard_stats["error_lines"]
        if got != expected:
            raise InvariantError(f"shard {spec.shard} accounts for {got} lines of {expected}")
        result_lines += shard_stats["result_lines"]
        error_lines += shard_stats["error_lines"]
        result_sizes.append(shard_stats.get("results_bytes"))
        error_sizes.append(shard_stats.get("errors_bytes"))
        entry: dict[str, Any] = {
            "shard": spec.shard,
            "mode": spec.mode,
            "first_line": spec.first_line,
            "lines": spec.lines,
            "results": shard_stats["result_lines"],
            "errors": shard_stats["error_lines"],
            # lines the last sweep sent once more, and how many of those it turned into results
            "swept": stats.swept,
            "recovered": stats.recovered_by_sweep,
        }
        batch_models: dict[str, list[int]] = report.get("batch_models", {}) if report else {}
        batch_totals.merge(Stats(models={k: list(v) for k, v in batch_models.items()}))
        if report:
            entry["batch"] = {
                "batches": [
                    {"id": b["id"], "status": b.get("status"), "turnaround_s": b.get("turnaround_s")}
                    for b in report.get("batches", [])
                ],
                # rows no batch finished that RunShard then sent directly
                "direct_fallback_lines": report.get("fallback_lines", 0),
                # batches the provider refused for a full queue (`token_limit_exceeded`), created again
                "requeued": report.get("requeued", 0),
            }
        entry["paths"] = dict(sorted(stats.paths.items()))
        entry["provider_cost_usd"] = provider_costs(stats.models, batch_models)
        shards.append(entry)
    if assembled and deadlines is not None and time.monotonic() > deadlines.merge:
        # a call that assembled a great deal does not merge a large job too: the next one finds
        # every shard finished and merges from a fresh clock
        raise OutOfTime(0)
    prefix = state["output_prefix"]
    keys = {kind: output_key(prefix, kind) for kind in OUTPUT_SUFFIXES}
    moved = concatenate(
        s3,
        bucket,
        [s.results_key for s in specs],
        keys["results"],
        content_type="application/jsonl",
        sizes=result_sizes,
    )
    concatenate(
        s3, bucket, [s.errors_key for s in specs], keys["errors"], content_type="application/jsonl", sizes=error_sizes
    )
    lines = plan.get("lines", sum(s.lines for s in specs))
    blank = plan.get("blank", sum(s.blank for s in specs))
    if result_lines + error_lines != lines - blank:
        raise InvariantError(f"outputs hold {result_lines + error_lines} lines; the input has {lines - blank} requests")
    started = float(job.get("started_at", clock()))
    wall = round(clock() - started, 3)
    requests = lines - blank
    max_error_rate = float(plan.get("max_error_rate", 0.0))
    unsent = totals.errors.get(ErrorCode.BUDGET_EXCEEDED, 0)
    if status is None:
        status = JobStatus.BUDGET_EXCEEDED if unsent else outcome_status(error_lines, requests, max_error_rate)
    summary = {
        "job_id": job_id,
        "status": status,
        "input": f"s3://{bucket}/{state['key']}",
        "outputs": {k: f"s3://{bucket}/{v}" for k, v in keys.items()},
        "counts": {
            "lines": lines,
            "blank": blank,
            "requests": requests,
            "results": result_lines,
            "errors": error_lines,
        },
        "error_rate": round(error_lines / requests, 6) if requests else 0.0,
        "max_error_rate": max_error_rate,
        # lines the provider answered, by how they went: a background job sends the endpoints
        # without a background form directly, a batch job sends directly what its batches left
        "lines_by_path": dict(sorted(totals.paths.items())),
        "errors_by_code": dict(sorted(totals.errors.items())),
        # one message a code, so a reader sees what each means without opening the errors file
        "error_examples": dict(sorted(totals.error_examples.items())),
        "tokens": {"input": totals.tokens_in, "output": totals.tokens_out},
        "attempts": totals.attempts,
        "retries": totals.retries,
        "throttled": totals.throttled,
        # lines whose attempts ran out on transient failures, sent once more at the shard's end
        "sweep": {"swept": totals.swept, "recovered": totals.recovered_by_sweep},
        # lines the response cache answered (not sent, not paid), lines sent, and what the hits would have cost
        "cache": {
            "mode": (plan.get("cache") or {}).get("mode", "off"),
            "hits": totals.cached,
            "misses": sum(totals.paths.values()) - totals.cached,
            "saved_usd": _saved_usd(direct_hits, batch_hits) if totals.cached else 0.0,
        },
        "latency_s": {q: totals.percentile_s(v) for q, v in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
        # what the report draws: the latency histogram and completions over time
        "latency_histogram": totals.latency_histogram(),
        "timeline": totals.timeline_dict(),
        "started_at": started,
        "wall_seconds": wall,
        "plan_seconds": plan.get("plan_seconds"),
        "mode": plan.get("mode"),
        "shards": shards,
        "merge": moved,
        "cost_estimate_usd": {
            **_provider_summary(provider_costs(totals.models, batch_totals.models)),
            "aws": aws_cost_usd(requests=lines - blank, shards=len(specs), wall_seconds=wall, failed=error_lines),
        },
    }
    if job.get("budget_cap"):
        summary["budget"] = {
            "cap_usd": nano_to_usd(int(job["budget_cap"])),
            # what the answers cost at list prices, as the shards counted it against the cap
            "spent_usd": nano_to_usd(int(job.get("budget_spent", 0))),
            "unsent_lines": unsent,
        }
    refused_lines = totals.errors.get(ErrorCode.PROVIDER_REFUSED, 0)
    summary[PROVIDER_REFUSED] = replace(refused, lines=refused_lines).to_dict() if refused and refused_lines else None
    if error:
        summary["error"] = error
    s3.put_object(
        Bucket=bucket,
        Key=keys["summary"],
        Body=orjson.dumps(summary, option=orjson.OPT_INDENT_2),
        ContentType="application/json",
    )
    store.finish_job(
        job_id,
        status=status,
        summary={k: summary[k] for k in ("counts", "outputs", "wall_seconds", "budget") if k in summary},
    )
    return summary
