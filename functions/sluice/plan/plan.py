"""Plan: stream the input once, validate every line, cut shards as byte ranges, write the manifest."""

from __future__ import annotations

import hashlib
import math
import re
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from sluice.cache.blobs import cache_store
from sluice.cache.lookup import CacheView
from sluice.contract import (
    DEFAULT_PROVIDER,
    INBOX_PREFIX,
    METADATA_PREFIX,
    OUTBOX_PREFIX,
    JobStatus,
    Mode,
    PlanCache,
    PlanFigures,
    Planned,
    Settings,
    ShardSpec,
    Summary,
    causes,
    deadline_plan_key,
    manifest_key,
    refused_prefix,
    shard_prefix,
    summary_key,
)
from sluice.contract.model import FLEX
from sluice.contract.state import input_pin
from sluice.core.costs import PRICED_MODELS
from sluice.formats.lines import READ_CHUNK, split_lines
from sluice.limits.budget import budget_models, usd_to_nano
from sluice.limits.flow import MAX_SHARD_CONNECTIONS
from sluice.plan.cache_plan import CacheAnswers, JobKeys, find_hits
from sluice.plan.deadline import Choice
from sluice.plan.deadline_choice import DeadlinePlan, running_shards
from sluice.plan.deadline_plan import CHOICE_MODES, plan_for_job
from sluice.plan.job_options import JobOptions, PlanError
from sluice.plan.line_pass import MAX_SHARD_BYTES, ShardRange, cut_shards, read_lines
from sluice.plan.turnarounds import read_turnarounds
from sluice.providers import batch_refuses, family
from sluice.send.output_check import cached_answer_check, read_job_schema
from sluice.shard.progress import ProgressSink
from sluice.store.input_rows import Running, Superseded
from sluice.store.jobs import JobStore

__all__ = ["MAX_SHARD_BYTES", "JobOptions", "PlanError", "ShardRange", "shard_prefix"]


@dataclass
class PlanResult:
    shards: list[ShardRange]
    lines: int
    requests: int
    invalid: dict[str, int]
    blank: int
    size: int


def job_id_for(bucket: str, key: str, etag: str) -> str:
    """One job per (bucket, key, ETag): a redelivered event maps to the same id."""
    stem = key.rsplit("/", 1)[-1].removesuffix(".jsonl")
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-")[:40] or "job"
    digest = hashlib.sha256(f"{bucket}\0{key}\0{etag.strip(chr(34))}".encode()).hexdigest()[:12]
    return f"{stem}-{digest}"


def output_prefix(key: str) -> str:
    """`inbox/team/reviews.jsonl` → `outbox/team/reviews`."""
    relative = key.removeprefix(INBOX_PREFIX)
    return OUTBOX_PREFIX + relative.removesuffix(".jsonl")


def plan_lines(
    lines: Iterable[bytes],
    *,
    shard_lines: int,
    shard_bytes: int = MAX_SHARD_BYTES,
    models: set[str | None] | None = None,
    model: str | None = None,
    default_model: str | None = None,
) -> PlanResult:
    """Plan's two passes without the cache: validate every line, then cut shards at line starts,
    each at most `shard_lines` lines and `shard_bytes` bytes (`sluice.plan.line_pass`)."""
    table = read_lines(lines, model=model, default_model=default_model, models=models)
    shards = cut_shards(table, shard_lines=shard_lines, shard_bytes=shard_bytes)
    return PlanResult(
        shards=shards,
        lines=table.lines,
        requests=table.requests,
        invalid=table.invalid,
        blank=table.blank,
        size=sum(table.lengths),
    )


def check_budget_models(options: JobOptions, settings: Settings, models: set[str | None]) -> None:
    """Refuse a budget the job could not hold: a request whose model has no known price could
    spend without limit, so the job stops at Plan, before anything is sent."""
    sent = {options.model} if options.model else {m or settings.default_model for m in models}
    unpriced = budget_models(sent)
    if unpriced:
        names = ", ".join(repr(m) if m else "(no model)" for m in unpriced)
        raise PlanError(
            f"{METADATA_PREFIX}budget-usd needs a price for every model, and {names} has none "
            f"({PRICED_MODELS}). Drop the budget, or send to a priced model with {METADATA_PREFIX}model"
        )


def check_batch_models(options: JobOptions, settings: Settings, models: set[str | None]) -> None:
    """Refuse a batch job none of whose lines a batch could take: every line would go direct, at
    list price, which is not what `mode: batch` asks for. Some lines may go direct (the summary and
    the run's end say how many): a job with one model the batch jobs run is not refused."""
    sent = {options.model} if options.model else {m or settings.default_model for m in models}
    reasons = [batch_refuses(settings.provider, model) for model in sorted(sent, key=str)]
    if sent and all(reasons):
        raise PlanError(
            f"{METADATA_PREFIX}mode=batch: no line of the job can go by batch ({reasons[0]}); every line would go "
            "direct at list price. Send them with mode direct, or name a model the batch jobs run"
        )


def event_key_candidates(key: str) -> list[str]:
    """The object keys an event's key may stand for: as it came, then URL-decoded.

    S3's event notifications URL-encode keys (a space as `+`, non-ASCII as UTF-8 `%XX`); the
    EventBridge event's key is documented plain. Sluice relies on neither: a key may come either
    way, and a `+` may be a plus or a space, so the ETag decides (`find_object`).
    """
    decoded = urllib.parse.unquote_plus(key)
    return [key] if decoded == key else [key, decoded]


@causes.under(causes.PLAN, causes.MARK_FAILED)
def find_object(s3: Any, bucket: str, key: str, etag: str) -> tuple[str, dict[str, Any]]:
    """The key and HeadObject answer of the object an event names: the candidate with its ETag.

    Without s3:ListBucket a missing key answers 403 rather than 404, so each refusal only means
    "not this one"; if no candidate matches, the first refusal is the error.
    """
    quoted = '"' + etag.strip('"') + '"'
    refusals: list[Exception] = []
    for candidate in event_key_candidates(key):
        try:
            return candidate, s3.head_object(Bucket=bucket, Key=candidate, IfMatch=quoted)
        except Exception as exc:
            status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status not in (403, 404, 412):
                raise
            refusals.append(exc)
    raise refusals[0]


@causes.under(causes.PLAN)
def plan_job(
    *,
    s3: Any,
    store: JobStore,
    settings: Settings,
    bucket: str,
    key: str,
    etag: str,
    execution: str,
    progress: ProgressSink | None = None,
) -> Planned:
    """Plan one input object. Returns the state the workflow carries to the Map and Merge."""
    key, head = find_object(s3, bucket, key, etag)
    job_id = job_id_for(bucket, key, etag)
    quoted = '"' + etag.strip('"') + '"'
    # the version that has this ETag (an unversioned bucket's answer names none, or "null"): every
    # read of the job is of it, so an overwrite of the key mid-job changes nothing the job reads
    version = "" if head.get("VersionId") in (None, "null") else str(head["VersionId"])
    uploaded = head.get("LastModified")
    options = JobOptions.from_metadata(
        head.get("Metadata", {}), settings, uploaded_at=uploaded.timestamp() if uploaded is not None else None
    )
    if options.validate_schema:
        try:
            options = replace(options, schema=read_job_schema(s3, bucket, options.validate_schema))
        except ValueError as exc:
            raise PlanError(f"{METADATA_PREFIX}validate-schema={options.validate_schema!r}: {exc}") from exc
    planned = Planned(
        job_id=job_id,
        bucket=bucket,
        key=key,
        etag=quoted,
        manifest_key=manifest_key(job_id),
        output_prefix=output_prefix(key),
        map_concurrency=options.map_concurrency,
        duplicate=False,
    )
    started = time.time()
    if not store.claim_job(job_id, execution=execution, bucket=bucket, key=key, etag=quoted, started_at=started):
        return replace(planned, duplicate=True)
    if not _take_key(s3, store, planned, uploaded.timestamp() if uploaded is not None else started):
        return replace(planned, duplicate=True)

    result, cached, answered, models = _cut(s3, settings, options, planned, started, version)
    if progress is not None and cached:
        progress.cached(sum(cached.values()))
    deadline = None
    if options.deadline is not None:
        # the lines' model prices the plan (the first, where they name several)
        model = options.model or min((m for m in models if m), default=None) or settings.default_model
        # the job's own expected turnaround wins: then what earlier jobs measured is not read
        measured = (
            read_turnarounds(s3, bucket, settings.provider or DEFAULT_PROVIDER, model)
            if options.deadline.batch_turnaround_s is None
            else []
        )
        deadline = plan_for_job(options, settings, result.shards, now=time.time(), model=model, measured=measured)
        s3.put_object(
            Bucket=bucket,
            Key=deadline_plan_key(job_id),
            Body=orjson.dumps(deadline.to_dict()),
            ContentType="application/json",
        )
    manifest = _shard_specs(s3, settings, options, planned, result, answered, deadline, version)
    items = [spec.to_item() for spec in manifest]
    s3.put_object(Bucket=bucket, Key=planned.manifest_key, Body=orjson.dumps(items), ContentType="application/json")
    figures = PlanFigures(
        lines=result.lines,
        requests=result.requests,
        invalid=result.invalid,
        blank=result.blank,
        bytes=result.size,
        shards=len(result.shards),
        mode=options.mode,
        concurrency=options.concurrency,
        max_error_rate=options.max_error_rate,
        cache=PlanCache(mode=options.cache, hits=sum(cached.values())),
        plan_seconds=round(time.time() - started, 3),
    )
    store.record_plan(
        job_id,
        plan=figures,
        shards=[(s.index, s.lines, s.requests) for s in result.shards],
        mode=options.mode,
        shard_modes={spec.shard: spec.mode for spec in manifest},
        budget_cap=usd_to_nano(options.budget_usd),
        cached=cached,
        answered=answered,
    )
    return replace(planned, shards=len(result.shards), lines=result.lines)


def _take_key(s3: Any, store: JobStore, planned: Planned, uploaded_at: float) -> bool:
    """Make this job the one whose outputs the key's outbox names hold (`sluice.store.input_rows`).
    False, with the job ended and nothing sent, when another job holds the key: CANCELLED when a
    newer upload's job does; FAILED, refused, when an older upload's job still runs, with a summary
    beside the key's outputs that names that job and how to replace it."""
    source = f"s3://{planned.bucket}/{planned.key}"
    try:
        store.own_input(planned.bucket, planned.key, planned.job_id, uploaded_at)
    except Superseded as exc:
        store.finish_job(
            Summary(
                job_id=planned.job_id,
                status=JobStatus.CANCELLED,
                input=source,
                error=f"superseded before it ran: {exc}",
            )
        )
        return False
    except Running as running:
        summary = Summary(
            job_id=planned.job_id,
            status=JobStatus.FAILED,
            input=source,
            error=(
                f"refused: {source} was uploaded again while job {running.job_id} still runs it "
                f"(execution {running.execution}); that job keeps running and owns the key's outputs. "
                f"To replace it, cancel it first (sluice cancel {running.job_id}), then upload the key again"
            ),
        )
        s3.put_object(
            Bucket=planned.bucket,
            Key=summary_key(refused_prefix(planned.output_prefix, planned.job_id)),
            Body=orjson.dumps(summary.to_json(), option=orjson.OPT_INDENT_2),
            ContentType="application/json",
        )
        store.refuse_job(summary, running.job_id)
        return False
    return True


def _cut(
    s3: Any, settings: Settings, options: JobOptions, planned: Planned, started: float, version: str
) -> tuple[PlanResult, dict[int, int], set[int], set[str | None]]:
    """Read the object's lines and cut them into shards, answering from the cache what it holds.
    Also returns the cache hits per shard, the shards the cache answered whole and the lines'
    models (read for a budget or a deadline only)."""
    view: CacheView | None = None
    if options.cache in ("on", "read"):
        view = CacheView.load(
            cache_store(s3, settings),
            now=started,
            ttl_days=settings.cache_ttl_days,
            request_format=family(settings.provider),
        )
    # an empty cache costs Plan one LIST: no line is encoded or hashed for it
    keys = (
        JobKeys(
            settings.cache_provider_name,
            view.digits,
            model=options.model,
            default_model=settings.default_model,
            request_format=family(settings.provider),
        )
        if view is not None and len(view)
        else None
    )
    pin = input_pin(planned.etag, version)
    body = s3.get_object(Bucket=planned.bucket, Key=planned.key, **pin)["Body"]
    # a budget needs a price for every model the job sends to; the job's model replaces the lines'
    models: set[str | None] | None = (
        set()
        if (options.budget_usd or options.deadline is not None or options.mode == Mode.BATCH) and not options.model
        else None
    )
    table = read_lines(
        split_lines(body.iter_chunks(READ_CHUNK)),
        model=options.model,
        default_model=settings.default_model,
        keys=keys,
        models=models,
        request_format=family(settings.provider),
    )
    if options.budget_usd:
        check_budget_models(options, settings, models or set())
    if options.mode == Mode.BATCH:
        check_batch_models(options, settings, models or set())
    answers: CacheAnswers | None = None
    if view is not None and keys is not None:
        view.read_level0()
        hits = find_hits(view, keys, table.lines)
        answers = CacheAnswers(
            view,
            hits,
            table,
            keys,
            s3=s3,
            bucket=planned.bucket,
            key=planned.key,
            pin=pin,
            job_id=planned.job_id,
            keep=cached_answer_check(options.validate, options.schema),
        )
    shard_lines, shard_bytes = options.shard_limits(settings)
    try:
        shards = cut_shards(
            table,
            shard_lines=shard_lines,
            shard_bytes=shard_bytes,
            answer=answers.answer if answers is not None else None,
            closed=answers.closed if answers is not None else None,
        )
    finally:
        if answers is not None:
            answers.finish()
    result = PlanResult(shards, table.lines, table.requests, table.invalid, table.blank, sum(table.lengths))
    if answers is None:
        return result, {}, set(), models or set()
    return result, answers.shard_hits, answers.answered, models or set()


def _shard_specs(
    s3: Any,
    settings: Settings,
    options: JobOptions,
    planned: Planned,
    result: PlanResult,
    answered: set[int],
    deadline: DeadlinePlan | None = None,
    version: str = "",
) -> list[ShardSpec]:
    """One spec per shard, each with an equal share of the job's limits; a shard's duplicate
    custom ids are written to a file of its own, which its spec names. A deadline job's shard runs
    as its plan chose (a shard the plan does not name, one the cache answered whole, direct)."""
    choices = deadline.choices() if deadline is not None else {}
    shares = deadline.cutover_shares() if deadline is not None else {}
    job_id = planned.job_id
    running = running_shards(len(result.shards), options.map_concurrency)
    # every running shard gets an equal share of the job's budgets; one Lambda holds at most
    # MAX_SHARD_CONNECTIONS sockets, so that its file descriptors last (however few shards run)
    per_shard = min(MAX_SHARD_CONNECTIONS, max(1, math.ceil(options.concurrency / running)))
    rpm_share = options.rpm / running if options.rpm else 0
    tpm_share = options.tpm / running if options.tpm else 0
    manifest = []
    for shard in result.shards:
        spec = ShardSpec(
            job_id=job_id,
            shard=shard.index,
            bucket=planned.bucket,
            key=planned.key,
            etag=planned.etag,
            version_id=version,
            start=shard.start,
            end=shard.end,
            first_line=shard.first_line,
            lines=shard.lines,
            mode=(
                CHOICE_MODES[choices.get(shard.index, Choice.DIRECT)]
                if deadline is not None
                else options.shard_mode(shard.requests, settings)
            ),
            on_batch_incomplete=options.on_batch_incomplete,
            cutover_at=deadline.cutover_at if choices.get(shard.index) == Choice.BATCH and deadline else None,
            cutover_share=shares.get(shard.index, 0.0),
            batch_cancel_s=deadline.cancel_s if deadline is not None else 0.0,
            service_tier=FLEX if choices.get(shard.index) == Choice.FLEX else "",
            choice=choices.get(shard.index, Choice.DIRECT) if deadline is not None else "",
            concurrency=per_shard,
            running=running,
            rpm=rpm_share,
            tpm=tpm_share,
            job_rpm=options.rpm,
            job_tpm=options.tpm,
            max_attempts=options.max_attempts,
            model=options.model,
            default_model=settings.default_model,
            duplicates_key=f"{shard_prefix(job_id, shard.index)}duplicates.json" if shard.duplicates else None,
            blank=shard.blank,
            budget_usd=options.budget_usd,
            cache=options.cache,
            cache_incomplete=options.cache_incomplete,
            answered=shard.index in answered,
            provider=settings.provider,
            validate=",".join(options.validate),
            validate_attempts=options.validate_attempts,
            validate_repair=options.validate_repair,
            validate_schema=options.schema,
        )
        if spec.duplicates_key is not None:
            s3.put_object(
                Bucket=planned.bucket,
                Key=spec.duplicates_key,
                Body=orjson.dumps({str(k): v for k, v in shard.duplicates.items()}),
                ContentType="application/json",
            )
        manifest.append(spec)
    return manifest
