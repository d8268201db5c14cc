"""Per-shard and per-job figures that merge cheaply: counters and a log-bucket histogram."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.contract.model import Outcome
from sluice.providers import RequestFormat, token_counts

# 20 buckets a decade from 1 ms: 5% resolution is plenty for p50/p95/p99 and the
# histogram stays a few hundred integers whatever the job size.
_BUCKETS_PER_DECADE = 20
_FLOOR_S = 0.001

# The completion timeline (for the report's throughput chart) counts outcomes per step of
# wall-clock time, in milliseconds. Each step divides the next, so keys of a finer step always
# fold into a coarser one; the step grows until the timeline fits, so merging stays cheap for
# any job length (0.1 s steps for a minute-long job, an hour's for a month-long one).
TIMELINE_STEPS_MS = (100, 1_000, 5_000, 15_000, 60_000, 300_000, 900_000, 3_600_000)
TIMELINE_MAX_POINTS = 720
# one message a code, cut to this length, so a report can show what each code means in this job
EXAMPLE_CHARS = 300


def _bucket(latency_s: float) -> int:
    if latency_s <= _FLOOR_S:
        return 0
    return int(math.log10(latency_s / _FLOOR_S) * _BUCKETS_PER_DECADE) + 1


def _bucket_upper_s(index: int) -> float:
    return float(_FLOOR_S * 10 ** (index / _BUCKETS_PER_DECADE))


def latency_bucket_bounds_s(index: int) -> tuple[float, float]:
    """The latencies a histogram bucket holds, [lower, upper); bucket 0 is everything up to 1 ms."""
    return (0.0 if index == 0 else _bucket_upper_s(index - 1)), _bucket_upper_s(index)


# a timeline slot: results, errors, and the 429s of the lines that ended in it
_SLOT = 3


def _slot(counts: list[int]) -> list[int]:
    """A slot of any release: the first ones kept no 429s."""
    return [*counts, *[0] * (_SLOT - len(counts))][:_SLOT]


def _fold(timeline: dict[int, list[int]], step: int) -> dict[int, list[int]]:
    folded: dict[int, list[int]] = {}
    for key, counts in timeline.items():
        slot = folded.setdefault(key // step * step, [0] * _SLOT)
        for i, n in enumerate(_slot(counts)):
            slot[i] += n
    return folded


@dataclass
class Stats:
    results: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    attempts: int = 0
    retries: int = 0
    # the most attempts one line took (the first pass's and the last sweep's)
    max_attempts: int = 0
    throttled: int = 0
    # failed attempts answered 5xx, and those whose connection was lost or timed out
    server_errors: int = 0
    lost: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    latency: dict[int, int] = field(default_factory=dict)
    # tokens by the model that answered, for the cost estimate
    models: dict[str, list[int]] = field(default_factory=dict)
    # the part of `models` answered at a tier billed at Batch API prices (OpenAI's flex processing)
    batch_priced_models: dict[str, list[int]] = field(default_factory=dict)
    # epoch millisecond a step starts -> [results, errors, 429s] of the lines that finished within it
    timeline: dict[int, list[int]] = field(default_factory=dict)
    timeline_step_ms: int = TIMELINE_STEPS_MS[0]
    # lines the provider answered, by the way they were sent (direct, background, batch)
    paths: dict[str, int] = field(default_factory=dict)
    # error code -> the first message seen with it
    error_examples: dict[str, str] = field(default_factory=dict)
    # lines the last sweep sent again, and those of them it turned into results
    swept: int = 0
    recovered_by_sweep: int = 0
    # results answered from the response cache, and their tokens by model: not paid again, so
    # not in `tokens_*`/`models` (what the job cost) but what it saved
    cached: int = 0
    cached_models: dict[str, list[int]] = field(default_factory=dict)
    # a validating job's lines by how they ended (`sluice.send.output_check`: valid_first_time,
    # repaired, invalid), and `failed_<check>`: the answers each check turned down
    validation: dict[str, int] = field(default_factory=dict)
    # lines asked at a tier (flex) that went on at the standard one (`Outcome.tier_fallback`)
    tier_fallback: int = 0

    def add_cached(self, model: str | None, tokens_in: int, tokens_out: int) -> None:
        """A result the cache answered: counted, its tokens what the job did not pay for."""
        self.results += 1
        self.cached += 1
        self.paths["cache"] = self.paths.get("cache", 0) + 1
        if model:
            per_model = self.cached_models.setdefault(model, [0, 0])
            per_model[0] += tokens_in
            per_model[1] += tokens_out

    def add_outcome(
        self,
        outcome: Outcome,
        at: float | None = None,
        path: str | None = None,
        *,
        request_format: RequestFormat,
        timed: bool = True,
    ) -> tuple[str, int, int] | None:
        """`request_format`: how the answer's body reads. `timed=False` for answers without a
        latency of their own (a batch's rows are answered together: their turnaround is the batch's,
        reported per batch instead). Returns an answer's (model, tokens in, tokens out) as
        `cache.answer_usage` would, for the cache to keep it without reading the body again; None
        for a failure."""
        usage: tuple[str, int, int] | None = None
        if path is not None:
            self.paths[path] = self.paths.get(path, 0) + 1
        self.attempts += outcome.attempts
        self.retries += max(outcome.attempts - 1, 0)
        self.max_attempts = max(self.max_attempts, outcome.attempts)
        self.throttled += outcome.throttled
        self.server_errors += outcome.server_errors
        self.lost += outcome.lost
        self.tier_fallback += outcome.tier_fallback
        if outcome.swept:
            self.swept += 1
            self.recovered_by_sweep += outcome.ok
        if outcome.validation is not None or outcome.failed_checks:
            self._validated(outcome)
        if outcome.ok:
            self.results += 1
            used = request_format.usage(outcome.body)
            tokens = token_counts(used)
            tokens_in, tokens_out = tokens[0], tokens[1]
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out
            model = request_format.answered_model(outcome.body)
            if model is not None:
                _add_tokens(self.models, {model: tokens})
                if request_format.batch_priced(outcome.body):
                    _add_tokens(self.batch_priced_models, {model: tokens})
            if timed:
                key = _bucket(outcome.latency_s)
                self.latency[key] = self.latency.get(key, 0) + 1
            usage = (model, tokens_in, tokens_out) if model is not None else ("", 0, 0)
        else:
            self.add_error(outcome.error_code or "unknown", outcome.error_message)
        # the sink sees an outcome the moment it is final, so now is its completion time; its
        # 429s came within its retries, shortly before
        self._mark(time.time() if at is None else at, outcome.ok, outcome.throttled)
        return usage

    def _mark(self, at: float, ok: bool, throttled: int = 0) -> None:
        step = self.timeline_step_ms
        slot = self.timeline.setdefault(int(at * 1000) // step * step, [0] * _SLOT)
        slot[0 if ok else 1] += 1
        slot[2] += throttled
        if len(self.timeline) > TIMELINE_MAX_POINTS:
            self._coarsen(step)

    def _coarsen(self, at_least: int) -> None:
        """Fold the timeline into a step of `at_least` ms or more, and coarser until it fits."""
        for step in TIMELINE_STEPS_MS:
            if step < at_least or step < self.timeline_step_ms:
                continue
            if step != self.timeline_step_ms:
                self.timeline = _fold(self.timeline, step)
                self.timeline_step_ms = step
            if len(self.timeline) <= TIMELINE_MAX_POINTS:
                return

    def add_error(self, code: str, message: str | None = None) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1
        if message and code not in self.error_examples:
            self.error_examples[code] = message[:EXAMPLE_CHARS]

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def _validated(self, outcome: Outcome) -> None:
        validation = self.validation
        if outcome.validation is not None:
            validation[outcome.validation] = validation.get(outcome.validation, 0) + 1
        for check in outcome.failed_checks:
            validation[f"failed_{check}"] = validation.get(f"failed_{check}", 0) + 1

    def merge(self, other: Stats) -> None:
        self.results += other.results
        for code, n in other.errors.items():
            self.errors[code] = self.errors.get(code, 0) + n
        for code, message in other.error_examples.items():
            self.error_examples.setdefault(code, message)
        self.attempts += other.attempts
        self.retries += other.retries
        self.max_attempts = max(self.max_attempts, other.max_attempts)
        self.throttled += other.throttled
        self.server_errors += other.server_errors
        self.lost += other.lost
        self.tier_fallback += other.tier_fallback
        self.swept += other.swept
        self.recovered_by_sweep += other.recovered_by_sweep
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        for key, n in other.latency.items():
            self.latency[key] = self.latency.get(key, 0) + n
        _add_tokens(self.models, other.models)
        _add_tokens(self.batch_priced_models, other.batch_priced_models)
        for path, n in other.paths.items():
            self.paths[path] = self.paths.get(path, 0) + n
        self.cached += other.cached
        for outcome_kind, n in other.validation.items():
            self.validation[outcome_kind] = self.validation.get(outcome_kind, 0) + n
        _add_tokens(self.cached_models, other.cached_models)
        if other.timeline:
            self._coarsen(other.timeline_step_ms)
            step = self.timeline_step_ms
            theirs = other.timeline if other.timeline_step_ms == step else _fold(other.timeline, step)
            for key, counts in theirs.items():
                slot = self.timeline.setdefault(key, [0] * _SLOT)
                for i, n in enumerate(_slot(counts)):
                    slot[i] += n
            if len(self.timeline) > TIMELINE_MAX_POINTS:
                self._coarsen(step)

    def percentile_s(self, q: float) -> float | None:
        total = sum(self.latency.values())
        if not total:
            return None
        rank = q * total
        seen = 0
        for key in sorted(self.latency):
            seen += self.latency[key]
            if seen >= rank:
                return round(_bucket_upper_s(key), 4)
        return round(_bucket_upper_s(max(self.latency)), 4)

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": self.results,
            "errors": dict(sorted(self.errors.items())),
            "error_examples": dict(sorted(self.error_examples.items())),
            "attempts": self.attempts,
            "retries": self.retries,
            "max_attempts": self.max_attempts,
            "throttled": self.throttled,
            "server_errors": self.server_errors,
            "lost": self.lost,
            "swept": self.swept,
            "recovered_by_sweep": self.recovered_by_sweep,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "latency": {str(k): v for k, v in sorted(self.latency.items())},
            "models": self.models,
            "batch_priced_models": self.batch_priced_models,
            "timeline_step_ms": self.timeline_step_ms,
            "timeline": {str(k): v for k, v in sorted(self.timeline.items())},
            "paths": dict(sorted(self.paths.items())),
            "cached": self.cached,
            "cached_models": self.cached_models,
            "validation": dict(sorted(self.validation.items())),
            "tier_fallback": self.tier_fallback,
        }

    def latency_histogram(self) -> list[dict[str, float | int]]:
        """Non-empty latency buckets, fastest first, with the range of seconds each holds."""
        rows: list[dict[str, float | int]] = []
        for key in sorted(self.latency):
            lower, upper = latency_bucket_bounds_s(key)
            rows.append({"bucket": key, "from_s": round(lower, 6), "to_s": round(upper, 6), "count": self.latency[key]})
        return rows

    def timeline_dict(self) -> dict[str, object]:
        """Completions per step of wall-clock time (epoch seconds), [start, results, errors, 429s]:
        what the report draws throughput from."""
        return {
            "step_s": self.timeline_step_ms / 1000,
            "points": [[key / 1000, *_slot(counts)] for key, counts in sorted(self.timeline.items())],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stats:
        return cls(
            results=data.get("results", 0),
            errors=dict(data.get("errors", {})),
            error_examples=dict(data.get("error_examples", {})),
            attempts=data.get("attempts", 0),
            retries=data.get("retries", 0),
            max_attempts=data.get("max_attempts", 0),
            throttled=data.get("throttled", 0),
            server_errors=data.get("server_errors", 0),
            lost=data.get("lost", 0),
            swept=data.get("swept", 0),
            recovered_by_sweep=data.get("recovered_by_sweep", 0),
            tokens_in=data.get("tokens_in", 0),
            tokens_out=data.get("tokens_out", 0),
            latency={int(k): v for k, v in data.get("latency", {}).items()},
            models={k: list(v) for k, v in data.get("models", {}).items()},
            batch_priced_models={k: list(v) for k, v in data.get("batch_priced_models", {}).items()},
            timeline={int(k): _slot(list(v)) for k, v in data.get("timeline", {}).items()},
            timeline_step_ms=int(data.get("timeline_step_ms", TIMELINE_STEPS_MS[0])),
            paths=dict(data.get("paths", {})),
            cached=data.get("cached", 0),
            cached_models={k: list(v) for k, v in data.get("cached_models", {}).items()},
            validation=dict(data.get("validation", {})),
            tier_fallback=data.get("tier_fallback", 0),
        )


def _add_tokens(into: dict[str, list[int]], tokens: Mapping[str, list[int]]) -> None:
    """Add each model's [input, output, cached input, cache write] tokens of `tokens` to `into`'s
    (stats written before the cache's counts hold only the first two)."""
    for model, counts in tokens.items():
        per_model = into.setdefault(model, [])
        per_model.extend([0] * (len(counts) - len(per_model)))
        for i, count in enumerate(counts):
            per_model[i] += count
