"""A deadline job's plan from what Plan knows: its options, the environment's settings and its shards
(`sluice.plan.deadline_choice` does the arithmetic; this module only gathers its inputs)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.contract import DEFAULT_PROVIDER, METADATA_PREFIX, Mode, Settings, parse_rate_limits
from sluice.plan.deadline import Choice, DeadlineRefused, expected_turnaround
from sluice.plan.deadline_choice import (
    DeadlineInputs,
    DeadlinePlan,
    KeyLimits,
    ShardLoad,
    plan_deadline,
    running_shards,
)
from sluice.plan.job_options import JobOptions, PlanError, key_rpm
from sluice.plan.line_pass import ShardRange
from sluice.providers import apis, modes
from sluice.providers import flex_models as flex_models_of

# what Plan counts a shard's tokens by: it keeps a line as a few bytes, not its text, so its input
# tokens are its bytes at about four a token (as the simulator counts), and each answer as long as
# `sluice estimate` assumes
BYTES_PER_TOKEN = 4
ASSUMED_OUTPUT_TOKENS = 300

# the mode a shard runs in for each choice: flex is a direct shard with `service_tier: flex`
CHOICE_MODES = {Choice.BATCH: Mode.BATCH, Choice.FLEX: Mode.DIRECT, Choice.DIRECT: Mode.DIRECT}


def key_limits(options: JobOptions, settings: Settings, model: str | None) -> KeyLimits:
    """The key's rate for the job: its `sluice-rpm`/`-tpm`, else the environment's `rate_limits`."""
    seed = parse_rate_limits(settings.rate_limits).get(model or settings.default_model or "")
    tpm = options.tpm or (seed.tpm if seed else 0)
    return KeyLimits(rpm=key_rpm(options.rpm, model, settings), tpm=tpm, concurrency=options.concurrency)


def deadline_inputs(
    options: JobOptions,
    settings: Settings,
    *,
    now: float,
    model: str | None,
    measured: Sequence[float] = (),
    shards: int = 0,
) -> DeadlineInputs:
    """What `plan_deadline` weighs besides the shards; `shards`: how many Plan cut (the cache's whole
    ones too), which sets the share of the key's rate each shard sends at."""
    assert options.deadline is not None
    family = settings.provider or DEFAULT_PROVIDER
    if options.deadline.batch_turnaround_s is not None:
        turnaround, source = options.deadline.batch_turnaround_s, f"the job's {METADATA_PREFIX}batch-turnaround"
    else:
        turnaround, source = expected_turnaround(family, measured)
    has_batch = Mode.BATCH in modes(family)
    limits = apis.batch_limits(settings) if has_batch else None
    return DeadlineInputs(
        now=now,
        deadline=options.deadline.at,
        key=key_limits(options, settings, model),
        family=family,
        turnaround_s=turnaround,
        turnaround_source=source,
        cancel_s=options.deadline.batch_cancel_s or settings.batch_cancel_s,
        batch=has_batch,
        min_batch_requests=limits.min_records if limits else 1,
        queue_tokens=settings.batch_queue_limit(model) if limits and limits.token_queue else 0,
        flex=bool(flex_models_of(family)),
        flex_models=flex_models_of(family) + options.flex_models,
        slots=options.map_concurrency,
        running=running_shards(shards, options.map_concurrency) if shards else 0,
        max_batch_jobs=limits.max_jobs if limits else 0,
        batch_records=limits.max_records if limits else 0,
    )


def shard_loads(shards: Iterable[ShardRange], model: str | None) -> list[ShardLoad]:
    """Each shard Plan cut as the planner weighs it (the lines the cache answered are not sent)."""
    loads = []
    for shard in shards:
        requests = max(0, shard.requests - shard.hits)
        if shard.answered or not requests:
            continue
        share = requests / shard.requests if shard.requests else 0.0
        loads.append(
            ShardLoad(
                shard=shard.index,
                requests=requests,
                tokens_in=int((shard.end - shard.start) * share / BYTES_PER_TOKEN),
                tokens_out=requests * ASSUMED_OUTPUT_TOKENS,
                model=model,
            )
        )
    return loads


def plan_for_job(
    options: JobOptions,
    settings: Settings,
    shards: Sequence[ShardRange],
    *,
    now: float,
    model: str | None,
    measured: Sequence[float] = (),
) -> DeadlinePlan:
    """The job's deadline plan, or the PlanError that refuses it (with the earliest finish)."""
    inputs = deadline_inputs(options, settings, now=now, model=model, measured=measured, shards=len(shards))
    try:
        return plan_deadline(shard_loads(shards, model), inputs)
    except DeadlineRefused as exc:
        raise PlanError(f"{METADATA_PREFIX}deadline: {exc}") from exc
