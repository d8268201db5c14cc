"""`sluice run`: a job on this machine, through the same state machine and Lambda code as a
deployed environment, with moto for AWS and the user's provider or the simulator."""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from sluice.cache import default_cache_dir
from sluice.plan import job_id_for

from local.checks import NO_API_KEY, check_provider, out_dir
from local.cloud import LocalCloud, LocalSettings
from local.console import CliError, file_link, human_seconds, human_usd, job_exit_code, need_file, say
from local.inputs import check_file, require_valid
from local.interrupt import Interrupted, Signals, stop_run, writing_note
from local.progress import Display, LiveCounts
from local.report import write_report
from local.simulator import SimConfig, SimulatorServer

SIMULATOR_PROVIDER = "sluice-simulator"


@contextmanager
def provider(latency_s: float) -> Iterator[tuple[str, str, str]]:
    """The user's provider when OPENAI_BASE_URL is set (with OPENAI_API_KEY, or none: a vLLM
    server needs none), else the simulator. A user's provider is checked before anything is sent."""
    base_url = os.environ.get("OPENAI_BASE_URL", "").strip()
    api_key = os.environ.get("OPENAI_API_KEY", "").strip()
    if base_url:
        check_provider(base_url, api_key or NO_API_KEY, key_given=bool(api_key))
        note = "" if api_key else " (OPENAI_API_KEY is not set: no API key is sent, as a vLLM server expects)"
        yield base_url, api_key or NO_API_KEY, f"provider: {base_url}{note}"
        return
    if api_key:
        say(
            "note: OPENAI_API_KEY is set but OPENAI_BASE_URL is not, so this run uses the simulator; "
            "set OPENAI_BASE_URL=https://api.openai.com/v1 to send it to OpenAI"
        )
    # a run cut short stops the simulator with requests in flight, which aiohttp's server logs
    # with a traceback; the job's outputs already say what happened to each of them
    server_log = logging.getLogger("aiohttp.server")
    level, server_log.level = server_log.level, logging.CRITICAL
    try:
        with SimulatorServer(SimConfig(latency_s=latency_s)) as sim:
            yield sim.base_url, "sk-simulator", f"provider: built-in SIMULATOR at {sim.base_url} (not a real model)"
    finally:
        server_log.setLevel(level)


def run(args: argparse.Namespace) -> int:
    signals = Signals()
    signals.install()
    try:
        return _run(args, signals)
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


def _run(args: argparse.Namespace, signals: Signals) -> int:
    path = need_file(Path(args.file))
    out = out_dir(Path(args.out))
    # the same check as `submit`: a file that is not a job fails here, not as a job of errors
    require_valid(check_file(path, quiet=args.quiet), allow_invalid=args.allow_invalid)
    cache_dir = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if not args.no_cache:
        usable_cache_dir(cache_dir, given=bool(args.cache_dir))
    settings = LocalSettings(
        concurrency=args.concurrency,
        map_concurrency=args.map_concurrency,
        shard_lines=args.shard_lines,
        max_attempts=args.max_attempts,
        request_timeout_s=args.request_timeout,
        cache="off" if args.no_cache else "on",
        cache_dir=str(cache_dir),
        # the built-in simulator listens on a new port each run: its answers are keyed by its name
        cache_provider=None if os.environ.get("OPENAI_BASE_URL", "").strip() else SIMULATOR_PROVIDER,
    )
    metadata = {"sluice-mode": args.mode} if args.mode else {}
    if args.max_error_rate is not None:
        metadata["sluice-max-error-rate"] = str(args.max_error_rate)
    if args.budget_usd is not None:
        metadata["sluice-budget-usd"] = str(args.budget_usd)
    started = time.monotonic()
    interrupted: int | None = None
    with provider(args.latency) as (base_url, api_key, label):
        say(label)
        counts = LiveCounts()
        cloud = LocalCloud(provider_base_url=base_url, api_key=api_key, settings=settings, progress=counts)
        display = Display(counts, quiet=args.quiet)
        with display.starting("starting the local cloud (moto, in this process)"), cloud.running():
            key, etag = cloud.upload(path, metadata=metadata)
            job_id = job_id_for(cloud.bucket, key, etag)
            execution = cloud.start(cloud.object_created_event(key, etag), name=job_id)
            signals.job_started()
            display.note(f"job {job_id} started (Ctrl-C cancels it and keeps what finished)")
            with display:

                def read_total() -> None:
                    # the display redraws on its own thread; the job row is read only until Plan has counted the lines
                    if counts.total is None:
                        requests = (cloud.job(job_id) or {}).get("requests")
                        counts.total = int(requests) if requests is not None else None

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
            stem = key.removeprefix("inbox/").removesuffix(".jsonl")
            written: dict[str, Path] = {}
            for kind, suffix in (
                ("results", ".results.jsonl"),
                ("errors", ".errors.jsonl"),
                ("summary", ".summary.json"),
            ):
                try:
                    data = cloud.read(f"outbox/{stem}{suffix}")
                except Exception:
                    continue
                target = out / f"{stem}{suffix}"
                target.write_bytes(data)
                written[kind] = target
    wall = time.monotonic() - started
    summary = _local_summary(written, path) if "summary" in written else {}
    counts = summary.get("counts", {})
    # the job's own word; the execution's (ABORTED for a cancelled job) only when there is none
    status = str(summary.get("status") or {"ABORTED": "CANCELLED"}.get(final["status"], final["status"]))
    say(
        f"job {job_id}: {status} in {human_seconds(wall)} — "
        f"{counts.get('results', 0)} results, {counts.get('errors', 0)} errors{_swept(summary)}{_usage(summary)}"
    )
    if summary.get("budget"):
        budget = summary["budget"]
        say(
            f"budget {human_usd(budget['cap_usd'])}: spent {human_usd(budget['spent_usd'])} (est.); "
            f"{budget['unsent_lines']:,} lines not sent (errors `budget_exceeded`)"
        )
    if summary.get("error"):
        say(f"error: {summary['error']}")
    for kind, target in written.items():
        print(f"{kind}: {target}")
    if summary:
        report = write_report(summary, out / f"{stem}.report.html", files={k: p.name for k, p in written.items()})
        print(f"report: {file_link(report)}")
    if interrupted is not None:
        return 128 + interrupted
    return job_exit_code(status)


def _local_summary(written: dict[str, Path], input_path: Path) -> dict[str, Any]:
    """The job's summary with the files this run wrote in place of the local bucket's keys,
    which are gone once `sluice run` exits."""
    summary: dict[str, Any] = orjson.loads(written["summary"].read_bytes())
    summary["input"] = str(input_path)
    if isinstance(summary.get("outputs"), dict):
        summary["outputs"] = {kind: str(written[kind]) for kind in summary["outputs"] if kind in written}
    written["summary"].write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    return summary


def _swept(summary: dict[str, Any]) -> str:
    """`, 5 lines swept (3 recovered)`: lines the last sweep sent once more, when there were any."""
    sweep = summary.get("sweep") or {}
    swept = int(sweep.get("swept") or 0)
    if not swept:
        return ""
    return f", {swept:,} line{'s' if swept != 1 else ''} swept ({int(sweep.get('recovered') or 0):,} recovered)"


def _usage(summary: dict[str, Any]) -> str:
    """`, 43,210 tokens (41,000 in, 2,210 out), $0.0077 at list prices (est.)`: what the job used."""
    tokens = summary.get("tokens") or {}
    if not tokens:
        return ""
    tokens_in, tokens_out = int(tokens.get("input", 0)), int(tokens.get("output", 0))
    text = f", {tokens_in + tokens_out:,} tokens ({tokens_in:,} in, {tokens_out:,} out)"
    cost = (summary.get("cost_estimate_usd") or {}).get("provider")
    text += f", {human_usd(cost)} at list prices (est.)" if cost is not None else ""
    cache = summary.get("cache") or {}
    if cache.get("hits"):
        saved = cache.get("saved_usd")
        text += f"; {int(cache['hits']):,} answered from the cache, {int(cache.get('misses', 0)):,} sent"
        text += f", {human_usd(saved)} saved (est.)" if saved else ""
    return text
