"""`sluice run`: a job on this machine, through the same state machine and Lambda code as a
deployed environment, with moto for AWS and the user's provider or the simulator."""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sluice.cache.entries import default_cache_dir
from sluice.contract import (
    BEDROCK_PROVIDER,
    DEFAULT_PROVIDER,
    INBOX_PREFIX,
    OUTBOX_PREFIX,
    OUTPUT_SUFFIXES,
    STEPS,
    ExecutionStatus,
    JobStatus,
    Mode,
    output_key,
)
from sluice.plan.plan import PlanError, job_id_for
from sluice.providers import Signer

from sluice_local.bedrock_endpoint import users_endpoint
from sluice_local.checks import budget_needs_prices, out_dir, usable_out_dir
from sluice_local.cli.estimate_deadline import local_cancel_s
from sluice_local.cli.validate_options import check_repair
from sluice_local.cloud import LocalCloud, LocalSettings
from sluice_local.console import EXIT_USAGE, CliError, download_output, file_link, need_file, say
from sluice_local.heap import few_arenas
from sluice_local.inputs import check_file, model_of, require_valid
from sluice_local.interrupt import Interrupted, Signals, stop_run, writing_note
from sluice_local.ledger import CallLedger
from sluice_local.progress import Display, LiveCounts
from sluice_local.providers import check_mode, provider, users_base_url
from sluice_local.report import write_report
from sluice_local.run_end import (
    RunFacts,
    batch_direct_lines,
    budget_lines,
    deadline_lines,
    error_lines,
    exit_code,
    local_summary,
    longest,
    refusal_lines,
    swept,
    timing,
    usage,
    validation_lines,
)
from sluice_local.simulator import SimulatorServer
from sluice_local.turnarounds import copy_back, seed, turnarounds_root

SIMULATOR_PROVIDER = "sluice-simulator"


def run(args: argparse.Namespace) -> int:
    few_arenas()
    signals = Signals()
    signals.install()
    try:
        return run_job(args, signals).code
    except Interrupted as exc:
        # before the job started: nothing was sent, and there are no outputs to write
        say(f"\nsluice: interrupted ({exc}) before the job started: nothing was sent")
        return exc.exit_code
    finally:
        signals.restore()


def usable_cache_dir(path: Path, *, given: bool) -> None:
    """Refuse a cache directory the run could not write before anything is sent: found out by
    a shard, it would fail the whole job after the fact."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
            pass
    except OSError as exc:
        where = "--cache-dir" if given else "the response cache (set --cache-dir, or --no-cache)"
        raise CliError(f"{where}: cannot write {path}: {exc.strerror or exc}") from exc


@dataclass(frozen=True)
class Ended:
    """How a run ended: its exit code, and what the Python API hands back as a job."""

    code: int
    job_id: str
    status: str
    # results, errors and summary, as written in --out
    written: dict[str, Path]
    report: Path | None
    summary: dict[str, Any]
    interrupted: int | None


def run_job(args: argparse.Namespace, signals: Signals) -> Ended:
    """The job of `args` (as `sluice run` parses them) from its checks to its report; `signals` stops it."""
    started = getattr(args, "started", None) or time.monotonic()
    endpoint = users_endpoint() if args.provider == BEDROCK_PROVIDER else None
    if endpoint is not None:
        _bedrock_mode(args)
    path, settings = _checked(args)
    out = out_dir(Path(args.out))
    # with --quiet, only how the job ended is said (and why, when it did not succeed)
    tell = (lambda _text: None) if args.quiet else say
    with provider(args.provider, args.latency, endpoint, args.sim_batch_turnaround) as (
        base_url,
        api_key,
        label,
        simulator,
    ):
        tell(label)
        ran = _through_local_cloud(
            args, signals, path, out, settings, base_url, api_key, simulator, endpoint.sign if endpoint else None
        )
    facts = RunFacts(
        input_path=path,
        provider=_provider_name(args.provider, base_url, args.latency),
        settings=_settings_shown(args),
        cache=not args.no_cache,
    )
    return _ended(args, ran, facts, started, out, tell)


def _bedrock_mode(args: argparse.Namespace) -> None:
    """A run at the user's Bedrock runtime endpoint sends every line directly: batch inference jobs are
    Bedrock's control plane (`bedrock`, not `bedrock-runtime`), which a local run emulates on the
    simulator only, so answers would come from two places."""
    if getattr(args, "deadline", None) is not None:
        raise CliError(
            "--deadline chooses between a batch and direct requests, and a Bedrock runtime endpoint "
            "(AWS_ENDPOINT_URL_BEDROCK_RUNTIME) has no batch jobs: run without --deadline",
            EXIT_USAGE,
        )
    if args.mode == Mode.BATCH:
        raise CliError(
            "--mode batch: Bedrock's batch inference jobs are not at its runtime endpoint "
            "(AWS_ENDPOINT_URL_BEDROCK_RUNTIME), and a local run emulates them on the built-in simulator only; "
            "use --mode direct, or unset the endpoint to run batch on the simulator",
            EXIT_USAGE,
        )
    if args.mode == Mode.AUTO:
        if not args.quiet:
            say("note: --mode auto runs direct at a Bedrock runtime endpoint (its batch jobs are not there)")
        args.mode = Mode.DIRECT


def _checked(args: argparse.Namespace) -> tuple[Path, LocalSettings]:
    """What is refused before anything is sent: a mode the provider has no API for, the input,
    the --out directory, a budget with no price to hold it to, a cache directory the shards
    could not write."""
    check_mode(args.provider, args.mode)
    check_repair(args)
    if getattr(args, "deadline", None) is not None and args.mode not in (None, Mode.AUTO):
        raise CliError(
            f"--deadline picks batch, flex or direct for each shard, so it takes no --mode {args.mode}: "
            "drop --mode (or use --mode auto)",
            EXIT_USAGE,
        )
    path = need_file(Path(args.file))
    usable_out_dir(Path(args.out))
    # the models the lines name, for a budget that needs a price for each (none to read with --model)
    models: set[str | None] = set()
    need_models = args.budget_usd is not None and not args.model
    # the same check as `submit`: a file that is not a job fails here, not as a job of errors
    check = check_file(
        path,
        quiet=args.quiet,
        on_request=(lambda r: models.add(model_of(r))) if need_models else None,
        provider=args.provider,
    )
    require_valid(check, allow_invalid=args.allow_invalid)
    settings = _settings(args)
    if args.budget_usd is not None:
        budget_needs_prices(args.model, models, settings.default_model)
    if not args.no_cache:
        usable_cache_dir(Path(str(settings.cache_dir)), given=bool(args.cache_dir))
    return path, settings


def _job_metadata(args: argparse.Namespace) -> dict[str, str]:
    """The job's own options, as the input object's metadata carries them (as `submit` sets them)."""
    metadata = {"sluice-mode": args.mode} if args.mode else {}
    if args.model:
        metadata["sluice-model"] = args.model
    if args.max_error_rate is not None:
        metadata["sluice-max-error-rate"] = str(args.max_error_rate)
    if args.budget_usd is not None:
        metadata["sluice-budget-usd"] = str(args.budget_usd)
    if args.validate is not None:
        metadata["sluice-validate"] = args.validate
        metadata["sluice-validate-repair"] = "yes" if args.repair else "no"
    if args.validate_schema:
        # beside the input, where Plan reads it; only a .jsonl under inbox/ starts a job
        metadata["sluice-validate-schema"] = f"{INBOX_PREFIX}schemas/{Path(args.validate_schema).name}"
    if args.validate_attempts is not None:
        metadata["sluice-validate-attempts"] = str(args.validate_attempts)
    for option in (
        "on_batch_incomplete",
        "deadline_hours",
        "deadline",
        "batch_turnaround",
        "rpm",
        "tpm",
        "flex_models",
        "batch_cancel",
    ):
        if getattr(args, option, None) is not None:
            metadata["sluice-" + option.replace("_", "-")] = str(getattr(args, option))
    return metadata


@dataclass
class _Ran:
    job_id: str
    stem: str
    final: dict[str, Any]
    # the signal that stopped the job, if one did
    interrupted: int | None
    written: dict[str, Path]
    # Plan refused the job's options (a PlanError): the user's to fix, as a bad argument is
    refused_at_plan: bool = False


def _through_local_cloud(
    args: argparse.Namespace,
    signals: Signals,
    path: Path,
    out: Path,
    settings: LocalSettings,
    base_url: str,
    api_key: str,
    simulator: SimulatorServer | None = None,
    sign: Signer | None = None,
) -> _Ran:
    """The job from upload to its outputs in `out`, shown as it goes; a signal stops it and
    keeps what was answered."""
    interrupted: int | None = None
    counts = LiveCounts()
    cloud = LocalCloud(
        provider_base_url=base_url,
        api_key=api_key,
        settings=settings,
        progress=counts,
        simulator=simulator,
        sign=sign,
        calls=CallLedger(record=False),
    )
    display = Display(counts, quiet=args.quiet)
    # what earlier runs measured of batch turnarounds, for a deadline job's plan; this run's added after
    kept = turnarounds_root(Path(str(settings.cache_dir)), simulated=not users_base_url(args.provider))
    with display.starting("starting the local cloud (moto, in this process)"), cloud.running():
        seed(cloud, kept)
        metadata = _job_metadata(args)
        if args.validate_schema:
            cloud.upload(Path(args.validate_schema), key=metadata["sluice-validate-schema"])
        key, etag = cloud.upload(path, metadata=metadata)
        job_id = job_id_for(cloud.bucket, key, etag)
        execution = cloud.start(cloud.object_created_event(key, etag), name=job_id)
        signals.job_started()
        if not args.quiet:
            display.note(f"job {job_id} started (Ctrl-C cancels it and keeps every answer so far)")
        with display:

            def read_total() -> None:
                # the display redraws on its own thread; the job row is read only until Plan has counted the lines
                if counts.total is None:
                    job = cloud.job(job_id)
                    counts.total = job.job.requests if job else None

            def tick() -> None:
                # a signal is only recorded while the job runs: here is where it stops the wait
                signals.check()
                read_total()

            try:
                final = cloud.wait(execution, on_tick=tick)
            except Interrupted as exc:
                interrupted = exc.signum
                final = stop_run(cloud, job_id, execution, base_url, api_key, signals)
            signals.doing(writing_note())
            read_total()
        stem = key.removeprefix(INBOX_PREFIX).removesuffix(".jsonl")
        written: dict[str, Path] = {}
        for kind, suffix in OUTPUT_SUFFIXES.items():
            # a range at a time: a million lines' results are not held in memory to be written
            fetch = functools.partial(cloud.download, output_key(OUTBOX_PREFIX + stem, kind))
            done = download_output(out / f"{stem}{suffix}", fetch)
            if done is not None:
                written[kind] = done
        _keep_turnarounds(cloud, kept)
    refused = any(
        i.step == STEPS["plan"].name and (i.error or "").startswith(f"{PlanError.__name__}(") for i in cloud.invocations
    )
    return _Ran(job_id, stem, final, interrupted, written, refused_at_plan=refused)


def _keep_turnarounds(cloud: LocalCloud, root: Path) -> None:
    """The batch turnarounds this job's Merge kept, into the cache directory; a directory that refuses
    them costs only the next deadline plan its figures, not this run its outputs."""
    try:
        copy_back(cloud, root)
    except OSError as exc:
        say(f"note: the batch turnarounds measured were not kept in {root}: {exc.strerror or exc}")


def _ended(
    args: argparse.Namespace, ran: _Ran, facts: RunFacts, started: float, out: Path, tell: Callable[[str], None]
) -> Ended:
    """How the job ended, said, and its report written; the exit code."""
    # as late as the summary allows: only the report's writing and the interpreter's exit come after
    command_s = time.monotonic() - started
    facts = replace(facts, command_seconds=command_s)
    summary = local_summary(ran.written, facts) if "summary" in ran.written else {}
    counts_of = summary.get("counts", {})
    # the job's own word; the execution's (ABORTED for a cancelled job) only when there is none
    status = str(
        summary.get("status")
        or {ExecutionStatus.ABORTED: JobStatus.CANCELLED}.get(ran.final["status"], ran.final["status"])
    )
    code = (
        EXIT_USAGE if ran.refused_at_plan and ran.interrupted is None else exit_code(summary, status, ran.interrupted)
    )
    results, errors = int(counts_of.get("results", 0)), int(counts_of.get("errors", 0))
    say(
        f"job {ran.job_id}: {status} {timing(summary, command_s)} — "
        f"{results:,} results, {errors:,} errors{swept(summary)}{longest(summary)}{usage(summary)}"
    )
    for line in validation_lines(summary) + deadline_lines(summary) + batch_direct_lines(summary):
        tell(line)
    why = error_lines(summary) + refusal_lines(summary) + budget_lines(summary, cache=not args.no_cache)
    if summary.get("error") and not summary.get("provider_refused"):
        why.append(f"error: {summary['error']}")
    for line in why:
        # what a script cannot guess from the exit code is said even with --quiet
        (say if code else tell)(line)
    report = None
    if summary:
        report = write_report(
            summary, out / f"{ran.stem}.report.html", files={k: p.name for k, p in ran.written.items()}
        )
    if not args.quiet:
        for kind, target in ran.written.items():
            print(f"{kind}: {target}")
        if report is not None:
            print(f"report: {file_link(report)}")
    return Ended(code, ran.job_id, status, ran.written, report, summary, ran.interrupted)


# what a local run's deadline keeps in hand after a cancelled batch ends: polls, collect, Merge
LOCAL_OVERHEAD_S = 6.0


def _settings(args: argparse.Namespace) -> LocalSettings:
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    return LocalSettings(
        # the job's --batch-cancel, when it says, rides in its metadata and wins in the plan
        batch_cancel_s=local_cancel_s(args.provider, args.sim_batch_turnaround),
        concurrency=args.concurrency,
        map_concurrency=args.map_concurrency,
        shard_lines=args.shard_lines,
        max_attempts=args.max_attempts,
        request_timeout_s=args.request_timeout,
        cache="off" if args.no_cache else "on",
        cache_dir=str(cache_dir),
        # the built-in simulator listens on a new port each run: its answers are keyed by its name
        cache_provider=None if users_base_url(args.provider) else SIMULATOR_PROVIDER,
        provider=args.provider,
    )


def _settings_shown(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings as the summary and the report show them."""
    return {
        "mode": args.mode or "direct",
        "model": args.model,
        "concurrency": args.concurrency,
        "map_concurrency": args.map_concurrency,
        "shard_lines": args.shard_lines,
        "max_attempts": args.max_attempts,
        "request_timeout_s": args.request_timeout,
        "budget_usd": args.budget_usd,
        "max_error_rate": args.max_error_rate or 0.0,
        "cache": "off" if args.no_cache else "on",
        "validate": args.validate,
    }


def _provider_name(family: str, base_url: str, latency_s: float) -> str:
    """Where the job was sent, as the summary and the report say it; the family when not OpenAI's."""
    where = base_url if users_base_url(family) else f"built-in simulator (not a real model; {latency_s:g} s an answer)"
    return where if family == DEFAULT_PROVIDER else f"{family}: {where}"
