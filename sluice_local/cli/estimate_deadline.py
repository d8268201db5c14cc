"""`sluice estimate --deadline`: the plan a deadline job would get, from the file's figures alone."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from sluice.cache.entries import default_cache_dir
from sluice.contract import LOCAL_SETTING_DEFAULTS, Mode
from sluice.plan.deadline import (
    DeadlineError,
    DeadlineRefused,
    expected_turnaround,
    flex_models,
    parse_deadline,
    parse_duration,
)
from sluice.plan.deadline_choice import (
    DeadlineInputs,
    DeadlinePlan,
    KeyLimits,
    ShardLoad,
    plan_deadline,
    running_shards,
)
from sluice.providers import flex_models as flex_models_of
from sluice.providers import modes

from sluice_local.console import EXIT_USAGE, CliError
from sluice_local.inputs import Estimate
from sluice_local.providers import users_base_url
from sluice_local.turnarounds import read_local, turnarounds_root

# the built-in simulator's batch turnaround when `--sim-batch-turnaround` is not given (3 x 0.2 s)
SIMULATOR_TURNAROUND_S = 0.6


def local_cancel_s(provider: str, sim_turnaround_s: float | None = None) -> float:
    """How long `sluice run` gives a cancelled batch when the job does not say (`--batch-cancel`):
    the built-in simulator ends one a phase (a third of its turnaround) after the cancel, heard
    within two polls; a user's provider, the deployed default."""
    if users_base_url(provider):
        return float(LOCAL_SETTING_DEFAULTS["batch_cancel_s"])
    turnaround = sim_turnaround_s if sim_turnaround_s is not None else SIMULATOR_TURNAROUND_S
    return turnaround / 3 + 2 * LOCAL_SETTING_DEFAULTS["poll_seconds"]


def shard_loads(est: Estimate, shard_lines: int) -> list[ShardLoad]:
    """The file's requests as Plan would cut them, model by model: `shard_lines` a shard, each with
    its share of the model's expected tokens."""
    loads: list[ShardLoad] = []
    for model, totals in est.by_model.items():
        shards = max(1, math.ceil(totals.requests / shard_lines))
        for n in range(shards):
            requests = min(shard_lines, totals.requests - n * shard_lines)
            share = requests / totals.requests if totals.requests else 0.0
            loads.append(
                ShardLoad(
                    shard=len(loads),
                    requests=requests,
                    tokens_in=round(totals.tokens_in * share),
                    tokens_out=round(totals.tokens_out * share),
                    model=None if model == "(no model)" else model,
                )
            )
    return loads


def measured(args: argparse.Namespace, est: Estimate) -> list[float]:
    """The batch turnarounds `sluice run` measured of the model the plan is priced by (as Plan picks
    it: --model, else the first the lines name), where a run with the same provider would keep them:
    the simulator's apart from a user's provider's."""
    model = args.model or min((m for m in est.by_model if m != "(no model)"), default=None)
    cache_dir = Path(args.cache_dir) if getattr(args, "cache_dir", None) else default_cache_dir()
    root = turnarounds_root(cache_dir, simulated=not users_base_url(args.provider))
    return read_local(root, args.provider, model)


def deadline_plan(args: argparse.Namespace, est: Estimate) -> DeadlinePlan:
    """The plan, or a CliError (exit 2) for a deadline that is wrong or cannot be met."""
    now = time.time()
    try:
        deadline = parse_deadline(args.deadline, now=now, name="--deadline")
        if Mode.BATCH not in modes(args.provider):
            raise DeadlineError(
                f"--deadline chooses between a batch and direct requests, and the {args.provider} provider has no "
                "Batch API Sluice runs"
            )
        if args.batch_turnaround:
            turnaround, source = float(parse_duration(args.batch_turnaround) or 0), "--batch-turnaround"
        else:
            turnaround, source = expected_turnaround(args.provider, measured(args, est))
        loads = shard_loads(est, args.shard_lines)
        slots = int(LOCAL_SETTING_DEFAULTS["map_concurrency"])
        inputs = DeadlineInputs(
            now=now,
            deadline=deadline,
            key=KeyLimits(rpm=args.rpm or 0, tpm=args.tpm or 0, concurrency=args.concurrency),
            family=args.provider,
            turnaround_s=turnaround,
            turnaround_source=source,
            # the margins `sluice run` would plan with: its cancel, its Map's slots
            cancel_s=parse_duration(args.batch_cancel or "") or local_cancel_s(args.provider),
            flex=bool(flex_models_of(args.provider)),
            flex_models=flex_models_of(args.provider) + flex_models(args.flex_models or ""),
            slots=slots,
            running=running_shards(len(loads), slots),
        )
        return plan_deadline(loads, inputs)
    except DeadlineRefused as exc:
        raise CliError(f"refused: {exc}", EXIT_USAGE) from exc
    except DeadlineError as exc:
        raise CliError(str(exc), EXIT_USAGE) from exc
