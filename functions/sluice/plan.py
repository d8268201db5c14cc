"""Plan: stream the input once, validate every line, cut shards as byte ranges, write the manifest."""

from __future__ import annotations

import hashlib
import math
import re
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from .budget import budget_models, usd_to_nano
from .cache import CacheIndex, Ref, answer_usage, cache_key, cache_store, cached_record, line_tag
from .contract import (
    BATCH_INCOMPLETE_POLICIES,
    CACHE_MODES,
    MODES,
    Settings,
    manifest_key,
    parse_budget,
    parse_error_rate,
)
from .costs import PROVIDER_PRICES
from .limits import MAX_SHARD_CONNECTIONS
from .lines import READ_CHUNK, LineError, parse_line, split_lines
from .model import ErrorCode, Request
from .parts import write_answered_shard, write_cached_part
from .progress import ProgressSink
from .records import record_id
from .stats import Stats
from .store import JobStore

MAX_SHARD_BYTES = 256 << 20
# the answers a shard the cache answers whole may grow to: Plan holds them (and their result
# lines) while it writes the shard's outputs
MAX_ANSWERED_BYTES = 64 << 20
METADATA_PREFIX = "sluice-"
# the Batch API's completion window: a job that must finish sooner cannot wait on a batch
BATCH_WINDOW_HOURS = 24.0


class PlanError(ValueError):
    """The job cannot start as asked (a bad option); the message says which and why."""


@dataclass(frozen=True)
class JobOptions:
    mode: str
    concurrency: int
    map_concurrency: int
    max_attempts: int
    model: str | None = None
    on_batch_incomplete: str = "direct"
    deadline_hours: float | None = None
    # provider budgets for the whole job; 0 = none
    rpm: int = 0
    tpm: int = 0
    # more failed lines than this share of the requests ends the job COMPLETED_WITH_ERRORS
    max_error_rate: float = 0.0
    # the job's spending cap in US dollars; 0 = none
    budget_usd: float = 0.0
    # the response cache: `on` answers from it and fills it, `read`/`write` one of the two
    cache: str = "on"
    # keep answers cut short (an `incomplete` response, `finish_reason: length`) too
    cache_incomplete: bool = False

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, str], settings: Settings) -> JobOptions:
        """Per-object overrides from S3 metadata (`x-amz-meta-sluice-mode: batch`, ...)."""
        meta = {
            k.lower().removeprefix(METADATA_PREFIX): v
            for k, v in metadata.items()
            if k.lower().startswith(METADATA_PREFIX)
        }
        known = {
            "mode",
            "concurrency",
            "map-concurrency",
            "max-attempts",
            "model",
            "parent-job",
            "on-batch-incomplete",
            "deadline-hours",
            "rpm",
            "tpm",
            "max-error-rate",
            "budget-usd",
            "cache",
            "cache-incomplete",
        }
        unknown = sorted(set(meta) - known)
        if unknown:
            raise PlanError(f"unknown option(s) in object metadata: {', '.join(METADATA_PREFIX + u for u in unknown)}")
        mode = meta.get("mode", settings.default_mode)
        if mode not in MODES:
            raise PlanError(f"{METADATA_PREFIX}mode={mode!r}; expected one of {', '.join(MODES)}")
        incomplete = meta.get("on-batch-incomplete", settings.on_batch_incomplete)
        if incomplete not in BATCH_INCOMPLETE_POLICIES:
            expected = ", ".join(BATCH_INCOMPLETE_POLICIES)
            raise PlanError(f"{METADATA_PREFIX}on-batch-incomplete={incomplete!r}; expected one of {expected}")
        deadline: float | None = None
        if "deadline-hours" in meta:
            raw_deadline = meta["deadline-hours"]
            try:
                deadline = float(raw_deadline)
            except ValueError:
                deadline = -1.0
            if not math.isfinite(deadline) or deadline <= 0:
                raise PlanError(f"{METADATA_PREFIX}deadline-hours={raw_deadline!r}; expected a positive number")
        if mode == "batch" and deadline is not None and deadline < BATCH_WINDOW_HOURS:
            raise PlanError(
                f"{METADATA_PREFIX}mode=batch cannot promise {METADATA_PREFIX}deadline-hours={meta['deadline-hours']}: "
                f"the Batch API may take up to {BATCH_WINDOW_HOURS:g} hours; use direct or auto"
            )

        max_error_rate = settings.max_error_rate
        if "max-error-rate" in meta:
            try:
                max_error_rate = parse_error_rate(meta["max-error-rate"])
            except ValueError as exc:
                raise PlanError(f"{METADATA_PREFIX}max-error-rate={meta['max-error-rate']!r}; {exc}") from exc

        budget_usd = settings.budget_usd
        if "budget-usd" in meta:
            try:
                budget_usd = parse_budget(meta["budget-usd"])
            except ValueError as exc:
                raise PlanError(f"{METADATA_PREFIX}budget-usd: {exc}") from exc
        cache = meta.get("cache", settings.cache)
        if cache not in CACHE_MODES:
            raise PlanError(
                f"{METADATA_PREFIX}cache={cache!r}; expected one of {', '.join(CACHE_MODES)} "
                "(on: answer from the cache and fill it; read, write: one of the two; off: neither)"
            )
        cache_incomplete = meta.get("cache-incomplete", "no").lower()
        if cache_incomplete not in ("yes", "no"):
            raise PlanError(f"{METADATA_PREFIX}cache-incomplete={cache_incomplete!r}; expected yes or no")

        def positive(name: str, default: int, *, zero: bool = False) -> int:
            raw = meta.get(name)
            if raw is None:
                return default
            if not raw.isdigit() or (int(raw) <= 0 and not zero):
                raise PlanError(f"{METADATA_PREFIX}{name}={raw!r}; expected a positive whole number")
            return int(raw)

        return cls(
            mode=mode,
            concurrency=positive("concurrency", settings.concurrency),
            map_concurrency=positive("map-concurrency", settings.map_concurrency),
            max_attempts=positive("max-attempts", settings.max_attempts),
            model=meta.get("model") or None,
            on_batch_incomplete=incomplete,
            deadline_hours=deadline,
            rpm=positive("rpm", settings.rpm, zero=True),
            tpm=positive("tpm", settings.tpm, zero=True),
            max_error_rate=max_error_rate,
            budget_usd=budget_usd,
            cache=cache,
            cache_incomplete=cache_incomplete == "yes",
        )

    def shard_mode(self, requests: int, settings: Settings) -> str:
        """The mode one shard runs in: `auto` batches the big shards when the job can wait."""
        if self.mode != "auto":
            return self.mode
        if self.deadline_hours is not None and self.deadline_hours < BATCH_WINDOW_HOURS:
            return "direct"
        return "batch" if requests >= settings.auto_batch_min_requests else "direct"


@dataclass
class ShardRange:
    index: int
    start: int
    end: int
    first_line: int
    lines: int = 0
    requests: int = 0
    blank: int = 0
    duplicates: dict[int, int] = field(default_factory=dict)


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
    relative = key.removeprefix("inbox/")
    return "outbox/" + relative.removesuffix(".jsonl")


class Resolver(Protocol):
    """Sees each request line as Plan reads it (its body canonical), and each shard as it closes.

    `find` looks a request up before Plan places it, and `request` files it in its shard with
    what was found; `answers` tells whether the shard so far needs nothing sent, and has room
    for more."""

    def find(self, request: Request) -> Any: ...
    def request(self, request: Request, found: Any) -> None: ...
    def answers(self, shard: ShardRange) -> bool: ...
    def shard_done(self, shard: ShardRange) -> None: ...


def plan_lines(
    lines: Iterable[bytes],
    *,
    shard_lines: int,
    shard_bytes: int = MAX_SHARD_BYTES,
    models: set[str | None] | None = None,
    resolver: Resolver | None = None,
    model: str | None = None,
    default_model: str | None = None,
) -> PlanResult:
    """Cut shards at line starts; each holds at most `shard_lines` lines and `shard_bytes` bytes.

    A shard the `resolver` answers whole never runs, so `shard_lines` does not bound it: it
    grows while its lines keep hitting, and Merge then copies its outputs server-side instead
    of passing shards smaller than a multipart part through itself.

    With `models`, the model each valid request names (None: none) is added to it.

    Validation happens here too, so that duplicates (which need the whole file) are known
    before any shard runs; shards re-validate their own lines with the same function.
    """
    keep_body = resolver is not None
    shards: list[ShardRange] = []
    first_seen: dict[str, int] = {}
    invalid: dict[str, int] = {}
    offset = 0
    number = 0
    requests = 0
    blank = 0
    current: ShardRange | None = None
    for raw in lines:
        number += 1
        parsed = parse_line(
            raw, number, keep_body=keep_body, model=model, default_model=default_model, sort_keys=keep_body
        )
        found = resolver.find(parsed) if resolver is not None and isinstance(parsed, Request) else None
        too_big = current is not None and current.lines > 0 and offset - current.start + len(raw) > shard_bytes
        full = (
            current is not None
            and current.lines >= shard_lines
            and not (found is not None and resolver is not None and resolver.answers(current))
        )
        if current is None or full or too_big:
            if current is not None:
                current.end = offset
                shards.append(current)
                if resolver is not None:
                    resolver.shard_done(current)
            current = ShardRange(index=len(shards), start=offset, end=offset, first_line=number)
        current.lines += 1
        offset += len(raw)
        if parsed is None:
            blank += 1
            current.blank += 1
            continue
        if isinstance(parsed, LineError):
            invalid[parsed.code] = invalid.get(parsed.code, 0) + 1
            continue
        first = first_seen.setdefault(parsed.custom_id, number)
        if first != number:
            current.duplicates[number] = first
            invalid[ErrorCode.DUPLICATE_CUSTOM_ID] = invalid.get(ErrorCode.DUPLICATE_CUSTOM_ID, 0) + 1
            continue
        current.requests += 1
        requests += 1
        if models is not None:
            model = orjson.loads(raw)["body"].get("model")
            models.add(model if isinstance(model, str) and model else None)
        if resolver is not None:
            resolver.request(parsed, found)
    if current is not None:
        current.end = offset
        shards.append(current)
        if resolver is not None:
            resolver.shard_done(current)
    return PlanResult(shards=shards, lines=number, requests=requests, invalid=invalid, blank=blank, size=offset)


def check_budget_models(options: JobOptions, settings: Settings, models: set[str | None]) -> None:
    """Refuse a budget the job could not hold: a request whose model has no known price could
    spend without limit, so the job stops at Plan, before anything is sent."""
    sent = {options.model} if options.model else {m or settings.default_model for m in models}
    unpriced = budget_models(sent)
    if unpriced:
        names = ", ".join(repr(m) if m else "(no model)" for m in unpriced)
        raise PlanError(
            f"{METADATA_PREFIX}budget-usd needs a price for every model, and {names} has none; "
            f"priced models: {', '.join(sorted(PROVIDER_PRICES))} (and their dated snapshots). "
            f"Drop the budget, or send to a priced model with {METADATA_PREFIX}model"
        )


def shard_prefix(job_id: str, shard: int) -> str:
    return f"jobs/{job_id}/shards/{shard:05d}/"


class CacheHits:
    """Plan's half of the response cache: each line's key against the index, and the hits
    written into their shard as a finished part, so the shard sends only the misses.

    Hits are fetched and written shard by shard as Plan passes them: memory holds one
    shard's hits, never the job's.
    """

    def __init__(self, index: CacheIndex, *, s3: Any, bucket: str, job_id: str, base_url: str) -> None:
        self.index = index
        self._s3 = s3
        self._bucket = bucket
        self._job_id = job_id
        self._base_url = base_url
        self._wanted: list[tuple[int, bytes, Ref]] = []
        self._custom_ids: dict[int, str] = {}
        self._answer_bytes = 0
        self.hits: dict[int, int] = {}
        self.answered: set[int] = set()

    def find(self, request: Request) -> tuple[bytes, Ref] | None:
        if not request.cache:
            return None
        key = cache_key(self._base_url, request.path, request.body, canonical=True)
        ref = self.index.find(key, line_tag(request.custom_id))
        return None if ref is None else (key, ref)

    def request(self, request: Request, found: tuple[bytes, Ref] | None) -> None:
        if found is not None:
            key, ref = found
            self._wanted.append((request.line, key, ref))
            self._custom_ids[request.line] = request.custom_id
            self._answer_bytes += ref.length

    def answers(self, shard: ShardRange) -> bool:
        """Every line of `shard` so far a hit, and its answers still few enough to hold."""
        return len(self._wanted) == shard.requests == shard.lines - shard.blank and (
            self._answer_bytes < MAX_ANSWERED_BYTES
        )

    def shard_done(self, shard: ShardRange) -> None:
        if not self._wanted:
            return
        rows: list[tuple[int, bytes]] = []
        stats = Stats()
        refs = {line: ref for line, _, ref in self._wanted}
        for line, answer in self.index.fetch(self._wanted):
            rows.append((line, cached_record(record_id(self._job_id, line), self._custom_ids[line], answer)))
            ref = refs[line]
            if ref.model is None:
                stats.add_cached(*answer_usage(orjson.loads(answer).get("body")))
            else:
                stats.add_cached(ref.model, ref.tokens_in, ref.tokens_out)
        self._wanted, self._custom_ids, self._answer_bytes = [], {}, 0
        if rows:
            rows.sort()
            prefix = shard_prefix(self._job_id, shard.index)
            # every line a request, and each answered: Plan writes the shard's outputs, and it never runs
            if len(rows) == shard.requests == shard.lines - shard.blank:
                write_answered_shard(self._s3, self._bucket, prefix, rows, stats)
                self.answered.add(shard.index)
            else:
                write_cached_part(self._s3, self._bucket, prefix, rows, stats)
            self.hits[shard.index] = len(rows)


def event_key_candidates(key: str) -> list[str]:
    """The object keys an event's key may stand for: as it came, then URL-decoded.

    S3's event notifications URL-encode keys (a space as `+`, non-ASCII as UTF-8 `%XX`); the
    EventBridge event's key is documented plain. Sluice relies on neither: a key may come either
    way, and a `+` may be a plus or a space, so the ETag decides (`find_object`).
    """
    decoded = urllib.parse.unquote_plus(key)
    return [key] if decoded == key else [key, decoded]


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
) -> dict[str, Any]:
    """Plan one input object. Returns the state the workflow carries to the Map and Merge."""
    key, head = find_object(s3, bucket, key, etag)
    job_id = job_id_for(bucket, key, etag)
    quoted = '"' + etag.strip('"') + '"'
    options = JobOptions.from_metadata(head.get("Metadata", {}), settings)
    state = {
        "job_id": job_id,
        "bucket": bucket,
        "key": key,
        "etag": quoted,
        "manifest_key": manifest_key(job_id),
        "output_prefix": output_prefix(key),
        "map_concurrency": options.map_concurrency,
        "duplicate": False,
    }
    started = time.time()
    if not store.claim_job(job_id, execution=execution, bucket=bucket, key=key, etag=quoted, started_at=started):
        return {**state, "duplicate": True}

    hits: CacheHits | None = None
    if options.cache in ("on", "read"):
        index = CacheIndex.load(cache_store(s3, settings))
        # an empty cache costs Plan one LIST: no line is encoded or hashed for it
        if len(index):
            hits = CacheHits(index, s3=s3, bucket=bucket, job_id=job_id, base_url=settings.cache_provider_name)
    body = s3.get_object(Bucket=bucket, Key=key, IfMatch=quoted)["Body"]
    # a budget needs a price for every model the job sends to; the job's model replaces the lines'
    models: set[str | None] | None = set() if options.budget_usd and not options.model else None
    result = plan_lines(
        split_lines(body.iter_chunks(READ_CHUNK)),
        shard_lines=settings.shard_lines,
        models=models,
        resolver=hits,
        model=options.model,
        default_model=settings.default_model,
    )
    if options.budget_usd:
        check_budget_models(options, settings, models or set())
    cached = hits.hits if hits is not None else {}
    answered = hits.answered if hits is not None else set()
    if progress is not None and cached:
        progress.cached(sum(cached.values()))

    running = max(1, min(len(result.shards), options.map_concurrency))
    # every running shard gets an equal share of the job's budgets; one Lambda holds at most
    # MAX_SHARD_CONNECTIONS sockets, so that its file descriptors last (however few shards run)
    per_shard = min(MAX_SHARD_CONNECTIONS, max(1, math.ceil(options.concurrency / running)))
    rpm_share = options.rpm / running if options.rpm else 0
    tpm_share = options.tpm / running if options.tpm else 0
    manifest = []
    for shard in result.shards:
        item: dict[str, Any] = {
            "job_id": job_id,
            "shard": shard.index,
            "bucket": bucket,
            "key": key,
            "etag": quoted,
            "start": shard.start,
            "end": shard.end,
            "first_line": shard.first_line,
            "lines": shard.lines,
            "mode": options.shard_mode(shard.requests, settings),
            "on_batch_incomplete": options.on_batch_incomplete,
            "concurrency": per_shard,
            "rpm": rpm_share,
            "tpm": tpm_share,
            "job_rpm": options.rpm,
            "job_tpm": options.tpm,
            "max_attempts": options.max_attempts,
            "model": options.model,
            "default_model": settings.default_model,
            "duplicates_key": None,
            "blank": shard.blank,
            "budget_usd": options.budget_usd,
            "cache": options.cache,
            "cache_incomplete": options.cache_incomplete,
            "answered": shard.index in answered,
        }
        if shard.duplicates:
            item["duplicates_key"] = f"jobs/{job_id}/shards/{shard.index:05d}/duplicates.json"
            s3.put_object(
                Bucket=bucket,
                Key=item["duplicates_key"],
                Body=orjson.dumps({str(k): v for k, v in shard.duplicates.items()}),
                ContentType="application/json",
            )
        manifest.append(item)
    s3.put_object(Bucket=bucket, Key=state["manifest_key"], Body=orjson.dumps(manifest), ContentType="application/json")
    plan_summary = {
        "lines": result.lines,
        "requests": result.requests,
        "invalid": result.invalid,
        "blank": result.blank,
        "bytes": result.size,
        "shards": len(result.shards),
        "mode": options.mode,
        "concurrency": options.concurrency,
        "max_error_rate": options.max_error_rate,
        "cache": {"mode": options.cache, "hits": sum(cached.values())},
        "plan_seconds": round(time.time() - started, 3),
    }
    store.record_plan(
        job_id,
        plan=plan_summary,
        shards=[(s.index, s.lines, s.requests) for s in result.shards],
        mode=options.mode,
        shard_modes={item["shard"]: item["mode"] for item in manifest},
        budget_cap=usd_to_nano(options.budget_usd),
        cached=cached,
        answered=answered,
    )
    return {**state, "shards": len(result.shards), "lines": result.lines}
