"""A job's own options: the environment's settings, overridden per input object by its S3 metadata
(`x-amz-meta-sluice-*`), checked at Plan before anything is sent."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.contract import (
    BATCH_INCOMPLETE_POLICIES,
    CACHE_MODES,
    JOB_OPTIONS,
    METADATA_PREFIX,
    MODES,
    PROVIDERS,
    Mode,
    Settings,
    parse_budget,
    parse_error_rate,
    parse_rate_limits,
    parse_validate,
)
from sluice.limits.flow import MAX_SHARD_CONNECTIONS
from sluice.plan.deadline import DeadlineError, JobDeadline, flex_models, read_job_deadline
from sluice.plan.line_pass import MAX_SHARD_BYTES
from sluice.providers import apis, modes

# the Batch API's completion window: a job that must finish sooner cannot wait on a batch
BATCH_WINDOW_HOURS = 24.0
# Plan measures a batch shard in its input's bytes, and the provider's rows are a little larger or
# smaller (a Bedrock record of a 200-byte chat line is 13% larger, of a 4 KB one 1%; SubmitBatch cuts
# a file at the limit again): a shard leaves this share of a batch file's bytes in hand, so that its
# rows fit in one file where the bytes bind, rather than a second file of the few rows past the limit
BATCH_BYTES_IN_HAND = 0.1


def capped_map_concurrency(asked: int, settings: Settings) -> int:
    """The shards a job runs at once: what it asks, at most the environment's `max_shards_in_flight`.

    Above the cap a shard only waits for a place (the shard steps' reserved concurrency), and the
    job's concurrency and rate would be split among shards that are not running."""
    cap = settings.max_shards_in_flight
    return min(asked, cap) if cap else asked


# How long a request may take from send to answer, for sizing a job's shards in flight to its key's
# rate. By Little's law a key at R requests a second keeps R x this in flight; fewer connections
# leave the key idle, more only wait in their Lambdas (GB-seconds billed while a shard sends half a
# request a second). It leans long, a long answer of a large model: guessed short, the job goes slower
# than its key; guessed long, a few shards more wait.
KEY_LATENCY_S = 30.0


def rate_capped_shards(asked: int, *, key_rpm: float, concurrency: int) -> int:
    """At most the shards a key at `key_rpm` keeps busy: the requests it keeps in flight (its rate
    times `KEY_LATENCY_S`, at most the job's `concurrency`) over what one shard holds
    (`MAX_SHARD_CONNECTIONS`), and at least one. No rate known: `asked`."""
    if not key_rpm:
        return asked
    in_flight = min(concurrency, key_rpm / 60 * KEY_LATENCY_S)
    return max(1, min(asked, math.ceil(in_flight / MAX_SHARD_CONNECTIONS)))


def key_rpm(options_rpm: int, model: str | None, settings: Settings) -> float:
    """The requests a minute the job's key allows it: its own `sluice-rpm`, else the environment's
    `rate_limits` for the model it names (or the default model); 0 when neither says."""
    if options_rpm:
        return options_rpm
    seed = parse_rate_limits(settings.rate_limits).get(model or settings.default_model or "")
    return seed.rpm if seed else 0


# what a mode asks of the provider, for a refusal's message
_MODE_APIS = {Mode.BATCH: "Batch API", Mode.BACKGROUND: "background responses"}


class PlanError(ValueError):
    """The job cannot start as asked (a bad option); the message says which and why."""


def _check_provider(asked: str | None, settings: Settings) -> None:
    """A job may name the provider family its lines are written for (`sluice-provider`), and
    runs only where the environment is configured for that family: the family's base URL and
    key are the environment's, one family an environment (`Settings.provider`)."""
    if asked is None or asked == settings.provider:
        return
    if asked not in PROVIDERS:
        raise PlanError(f"{METADATA_PREFIX}provider={asked!r}; expected one of {', '.join(PROVIDERS)}")
    raise PlanError(
        f"{METADATA_PREFIX}provider={asked}: this environment is configured for the {settings.provider} provider "
        f"only (its base URL and key); submit the job to an environment whose provider is {asked}"
    )


@dataclass(frozen=True)
class JobOptions:
    mode: str
    concurrency: int
    map_concurrency: int
    max_attempts: int
    model: str | None = None
    on_batch_incomplete: str = "direct"
    deadline_hours: float | None = None
    # the time the job must end by (`sluice-deadline`; `sluice.plan.deadline`): Plan picks each shard's way
    deadline: JobDeadline | None = None
    # models that take OpenAI's flex tier besides `sluice.plan.deadline.FLEX_MODELS` (`sluice-flex-models`)
    flex_models: tuple[str, ...] = ()
    # provider budgets for the whole job; 0 = none
    rpm: int = 0
    tpm: int = 0
    # more failed lines than this share of the requests ends the job COMPLETED_WITH_ERRORS
    max_error_rate: float = 0.0
    # the job's spending cap in US dollars; 0 = none
    budget_usd: float = 0.0
    # the response cache: `on` answers from it and fills it, `read`/`write` one of the two
    cache: str = "on"
    # keep answers cut short (an `incomplete` response, a completion stopped at its token limit) too
    cache_incomplete: bool = False
    # per-line output validation (`sluice.formats.validation`): the checks, the sends an answer gets in
    # all, and whether a resend carries what was wrong
    validate: tuple[str, ...] = ()
    validate_attempts: int = 1
    validate_repair: bool = False
    # where the schema the job names is: a key of the job's bucket under inbox/ ("": none), and
    # the schema as Plan read it (canonical JSON), for the cache lookup and the shards
    validate_schema: str = ""
    schema: str = ""

    @classmethod
    def from_metadata(
        cls, metadata: Mapping[str, str], settings: Settings, *, uploaded_at: float | None = None
    ) -> JobOptions:
        """Per-object overrides from S3 metadata (`x-amz-meta-sluice-mode: batch`, ...); a deadline's
        duration counts from `uploaded_at` (the object's LastModified; else now)."""
        meta = {
            k.lower().removeprefix(METADATA_PREFIX): v
            for k, v in metadata.items()
            if k.lower().startswith(METADATA_PREFIX)
        }
        unknown = sorted(set(meta) - set(JOB_OPTIONS))
        if unknown:
            raise PlanError(f"unknown option(s) in object metadata: {', '.join(METADATA_PREFIX + u for u in unknown)}")
        now = time.time()
        try:
            deadline = read_job_deadline(
                meta,
                mode=meta.get("mode"),
                family=settings.provider,
                has_batch=Mode.BATCH in modes(settings.provider),
                uploaded_at=now if uploaded_at is None else uploaded_at,
                now=now,
                prefix=METADATA_PREFIX,
            )
        except DeadlineError as exc:
            raise PlanError(str(exc)) from exc
        extra_flex = flex_models(meta.get("flex-models", ""))
        if extra_flex and deadline is None:
            raise PlanError(
                f"{METADATA_PREFIX}flex-models is read with {METADATA_PREFIX}deadline only, which picks flex; set one"
            )
        if deadline is not None and meta.get("on-batch-incomplete") == "error":
            raise PlanError(
                f"{METADATA_PREFIX}deadline sends what a cancelled batch left directly, so it takes no "
                f"{METADATA_PREFIX}on-batch-incomplete=error"
            )
        mode = meta.get("mode", Mode.AUTO if deadline is not None else settings.default_mode)
        if mode not in MODES:
            raise PlanError(f"{METADATA_PREFIX}mode={mode!r}; expected one of {', '.join(MODES)}")
        _check_provider(meta.get("provider"), settings)
        offered = modes(settings.provider)
        if mode != Mode.AUTO and mode not in offered:
            usable = ", ".join(m for m in MODES if m in offered or m == Mode.AUTO)
            raise PlanError(
                f"{METADATA_PREFIX}mode={mode}: the {settings.provider} provider has no {_MODE_APIS.get(mode, mode)} "
                f"Sluice can run; use one of {usable}"
            )
        incomplete = meta.get("on-batch-incomplete", "direct" if deadline else settings.on_batch_incomplete)
        if incomplete not in BATCH_INCOMPLETE_POLICIES:
            expected = ", ".join(BATCH_INCOMPLETE_POLICIES)
            raise PlanError(f"{METADATA_PREFIX}on-batch-incomplete={incomplete!r}; expected one of {expected}")
        deadline_hours: float | None = None
        if "deadline-hours" in meta:
            raw_deadline = meta["deadline-hours"]
            try:
                deadline_hours = float(raw_deadline)
            except ValueError:
                deadline_hours = -1.0
            if not math.isfinite(deadline_hours) or deadline_hours <= 0:
                raise PlanError(f"{METADATA_PREFIX}deadline-hours={raw_deadline!r}; expected a positive number")
        if mode == Mode.BATCH and deadline_hours is not None and deadline_hours < BATCH_WINDOW_HOURS:
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

        try:
            validate = parse_validate(meta.get("validate", settings.validate))
        except ValueError as exc:
            raise PlanError(f"{METADATA_PREFIX}validate={meta['validate']!r}: {exc}") from exc
        repair = meta.get("validate-repair", "yes" if settings.validate_repair == "on" else "no").lower()
        if repair not in ("yes", "no"):
            raise PlanError(f"{METADATA_PREFIX}validate-repair={repair!r}; expected yes or no")

        def positive(name: str, default: int, *, zero: bool = False) -> int:
            raw = meta.get(name)
            if raw is None:
                return default
            if not raw.isdigit() or (int(raw) <= 0 and not zero):
                raise PlanError(f"{METADATA_PREFIX}{name}={raw!r}; expected a positive whole number")
            return int(raw)

        concurrency = positive("concurrency", settings.concurrency)
        rpm = positive("rpm", settings.rpm, zero=True)
        model = meta.get("model") or None
        map_concurrency = capped_map_concurrency(positive("map-concurrency", settings.map_concurrency), settings)
        if mode != Mode.BATCH and deadline is None:
            # a batch shard sends nothing at the key's rate; the others share it. A deadline job's
            # batch shards must all be in flight from the start, or its cutover comes before some exist
            limit = key_rpm(rpm, model, settings)
            map_concurrency = rate_capped_shards(map_concurrency, key_rpm=limit, concurrency=concurrency)
        return cls(
            mode=mode,
            concurrency=concurrency,
            map_concurrency=map_concurrency,
            max_attempts=positive("max-attempts", settings.max_attempts, zero=True),
            model=model,
            on_batch_incomplete=incomplete,
            deadline_hours=deadline_hours,
            deadline=deadline,
            flex_models=extra_flex,
            rpm=rpm,
            tpm=positive("tpm", settings.tpm, zero=True),
            max_error_rate=max_error_rate,
            budget_usd=budget_usd,
            cache=cache,
            cache_incomplete=cache_incomplete == "yes",
            validate=validate,
            validate_attempts=positive("validate-attempts", settings.validate_attempts),
            validate_repair=repair == "yes",
            validate_schema=meta.get("validate-schema", ""),
        )

    def may_batch(self, settings: Settings) -> bool:
        """Whether a shard of the job may go as a batch: the job asks for batch mode, or for `auto`
        on a family with a Batch API and can wait a batch's window."""
        if self.mode == Mode.BATCH:
            return True
        if self.mode != Mode.AUTO or Mode.BATCH not in modes(settings.provider):
            return False
        return self.deadline_hours is None or self.deadline_hours >= BATCH_WINDOW_HOURS

    def shard_mode(self, requests: int, settings: Settings) -> str:
        """The mode one shard runs in: `auto` batches the big shards when the job can wait."""
        if self.mode != Mode.AUTO:
            return self.mode
        if not self.may_batch(settings):
            return Mode.DIRECT
        return Mode.BATCH if requests >= settings.auto_batch_min_requests else Mode.DIRECT

    def shard_limits(self, settings: Settings) -> tuple[int, int]:
        """The lines and bytes Plan cuts the job's shards at.

        A batch shard goes as one provider batch where its lines share an endpoint and model: it
        holds what one batch of the family may (`apis.batch_limits`), so that a job spends as few of
        the provider's batches as its lines allow (Bedrock runs 20 jobs a model at once, of up to
        50,000 records each), with `BATCH_BYTES_IN_HAND` of the bytes kept for the rows the provider's
        format makes of the lines. `auto` cuts batches when each full shard would go as one (its
        `auto_batch_min_requests` within a batch), so that a shard it sends direct still holds fewer
        requests than that. Any other shard holds `shard_lines`, which bounds a Lambda's run.
        """
        if self.deadline is not None:
            # a deadline chooses per shard: shards of `shard_lines`, so the choice has some to weigh
            return settings.shard_lines, MAX_SHARD_BYTES
        if self.may_batch(settings):
            limits = apis.batch_limits(settings)
            if self.mode == Mode.BATCH or settings.auto_batch_min_requests <= limits.max_records:
                room = int(limits.max_bytes * (1 - BATCH_BYTES_IN_HAND))
                return limits.max_records, min(MAX_SHARD_BYTES, room)
        return settings.shard_lines, MAX_SHARD_BYTES
