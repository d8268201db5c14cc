"""`sluice`: run a job on this machine, or submit, follow, fetch, cancel and retry jobs of a
deployed environment; estimate what a file will cost; start the provider simulator.

Imports are deferred to the command that needs them, so `--help` and the quick commands
start fast.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from local import checks
from local.console import (
    EXIT_CODES_HELP,
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    file_link,
    human_seconds,
    human_usd,
    job_exit_code,
    need_file,
    say,
)

if TYPE_CHECKING:
    from local.interrupt import CtrlC

# kept importable from here: older scripts and tests use them
__all__ = ["EXIT_INPUT", "EXIT_JOB_FAILED", "EXIT_OK", "CliError", "build_parser", "main"]

DEPLOYED_NOTE = (
    "works on a deployed environment (the stack Sluice-<env>). A local `sluice run` keeps\n"
    "nothing once it exits: its outputs and report are in its --out directory."
)


@contextmanager
def provider(latency_s: float) -> Iterator[tuple[str, str, str]]:
    """The user's provider when OPENAI_BASE_URL is set (with OPENAI_API_KEY, or none: a vLLM
    server needs none), else the simulator. A user's provider is checked before anything is sent."""
    from local.checks import NO_API_KEY, check_provider

    base_url = os.environ.get("OPENAI_BASE_URL", "").strip()
    api_key = os.environ.get("OPENAI_API_KEY", "").strip()
    if base_url:
        check_provider(base_url, api_key or NO_API_KEY, key_given=bool(api_key))
        note = "" if api_key else " (OPENAI_API_KEY is not set: no API key is sent, as a vLLM server expects)"
        yield base_url, api_key or NO_API_KEY, f"provider: {base_url}{note}"
        return
    from local.simulator import SimConfig, SimulatorServer

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
    from local.interrupt import CtrlC

    ctrl_c = CtrlC()
    try:
        return _run(args, ctrl_c)
    finally:
        ctrl_c.restore()


def _run(args: argparse.Namespace, ctrl_c: CtrlC) -> int:
    from local.checks import out_dir
    from local.inputs import check_file, require_valid
    from local.interrupt import cancel_run

    path = need_file(Path(args.file))
    out = out_dir(Path(args.out))
    # the same check as `submit`: a file that is not a job fails here, not as a job of errors
    require_valid(check_file(path, quiet=args.quiet), allow_invalid=args.allow_invalid)

    from sluice.plan import job_id_for

    from local.cloud import LocalCloud, LocalSettings
    from local.progress import Display, LiveCounts
    from local.report import write_report

    settings = LocalSettings(
        concurrency=args.concurrency,
        map_concurrency=args.map_concurrency,
        shard_lines=args.shard_lines,
        max_attempts=args.max_attempts,
        request_timeout_s=args.request_timeout,
    )
    metadata = {"sluice-mode": args.mode} if args.mode else {}
    if args.max_error_rate is not None:
        metadata["sluice-max-error-rate"] = str(args.max_error_rate)
    started = time.monotonic()
    interrupted = False
    with provider(args.latency) as (base_url, api_key, label):
        say(label)
        counts = LiveCounts()
        cloud = LocalCloud(provider_base_url=base_url, api_key=api_key, settings=settings, progress=counts)
        display = Display(counts, quiet=args.quiet)
        with display.starting("starting the local cloud (moto, in this process)"), cloud.running():
            key, etag = cloud.upload(path, metadata=metadata)
            job_id = job_id_for(cloud.bucket, key, etag)
            execution = cloud.start(cloud.object_created_event(key, etag), name=job_id)
            display.note(f"job {job_id} started (Ctrl-C cancels it and keeps what finished)")
            with display:

                def tick() -> None:
                    # the display redraws on its own thread; the job row is read only until Plan has counted the lines
                    if counts.total is None:
                        requests = (cloud.job(job_id) or {}).get("requests")
                        counts.total = int(requests) if requests is not None else None

                try:
                    final = cloud.wait(execution, on_tick=tick)
                except KeyboardInterrupt:
                    interrupted = True
                    ctrl_c.first()
                    final = cancel_run(cloud, job_id, execution, base_url, api_key, ctrl_c)
                tick()
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
        f"{counts.get('results', 0)} results, {counts.get('errors', 0)} errors{_usage(summary)}"
    )
    if summary.get("error"):
        say(f"error: {summary['error']}")
    for kind, target in written.items():
        print(f"{kind}: {target}")
    if summary:
        report = write_report(summary, out / f"{stem}.report.html", files={k: p.name for k, p in written.items()})
        print(f"report: {file_link(report)}")
    if interrupted:
        return EXIT_INTERRUPTED
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


def _usage(summary: dict[str, Any]) -> str:
    """`, 43,210 tokens (41,000 in, 2,210 out), $0.0077 at list prices (est.)`: what the job used."""
    tokens = summary.get("tokens") or {}
    if not tokens:
        return ""
    tokens_in, tokens_out = int(tokens.get("input", 0)), int(tokens.get("output", 0))
    text = f", {tokens_in + tokens_out:,} tokens ({tokens_in:,} in, {tokens_out:,} out)"
    cost = (summary.get("cost_estimate_usd") or {}).get("provider")
    return text + (f", {human_usd(cost)} at list prices (est.)" if cost is not None else "")


def simulator(args: argparse.Namespace) -> int:
    import asyncio

    from local import simulator as sim
    from local.sim_options import config_from

    if args.rate_429 + args.rate_500 + args.rate_drop + args.rate_slow > 1:
        raise CliError("--rate-429, --rate-500, --rate-drop and --rate-slow add up to more than 1", EXIT_USAGE)
    try:
        config = config_from(args)
    except ValueError as exc:
        raise CliError(f"simulator options: {exc}", EXIT_USAGE) from exc
    try:
        asyncio.run(sim.serve(args.host, args.port, config))
    except KeyboardInterrupt:
        return EXIT_OK
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", EXIT_USAGE) from exc
    return EXIT_OK


def estimate(args: argparse.Namespace) -> int:
    from local.inputs import estimate_file, require_valid

    est = estimate_file(
        Path(args.file),
        model=args.model,
        assumed_output_tokens=args.output_tokens,
        concurrency=args.concurrency,
        latency_s=args.latency,
        shard_lines=args.shard_lines,
        quiet=args.quiet,
    )
    require_valid(est.check, allow_invalid=args.allow_invalid)
    data = est.to_dict()
    if args.json:
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return EXIT_OK
    check = est.check
    urls = ", ".join(f"{url} {n:,}" for url, n in sorted(check.by_url.items()))
    print(
        f"{check.path}: {check.requests:,} requests "
        f"({check.lines:,} lines, {check.blank:,} blank, {check.invalid:,} invalid)"
    )
    print(f"  endpoints: {urls}")
    width = max([len("model"), *(len(m) for m in data["models"])])
    print(f"  {'model':<{width}} {'requests':>9} {'input tok':>11} {'exp. output':>11} {'direct':>11} {'batch':>11}")
    for model, row in data["models"].items():
        print(
            f"  {model:<{width}} {row['requests']:>9,} {row['input_tokens']:>11,} {row['output_tokens']:>11,} "
            f"{human_usd(row['direct_usd']):>11} {human_usd(row['batch_usd']):>11}"
        )
    a = data["assumptions"]

    def costs(kind: str) -> str:
        usd = data[kind]
        return f"direct/background {human_usd(usd['direct'])}, batch {human_usd(usd['batch'])}"

    uncapped = sum(row["requests_without_max_tokens"] for row in data["models"].values())
    print(
        f"  provider, expected: {costs('provider_usd')} — each answer {a['output_tokens']} tokens "
        "(--output-tokens) or its max_tokens if lower"
    )
    bound = (
        "every answer as long as its max_tokens allows"
        if not uncapped
        else f"not a bound: {uncapped:,} requests set no max_tokens and count {a['output_tokens']} tokens each"
    )
    print(f"  provider, at most:  {costs('provider_usd_at_most')} — {bound}")
    print(f"  provider, at least: {costs('provider_usd_at_least')} — one output token an answer")
    print("  (Batch API: half price, results within 24 h)")
    unpriced = [m for m, row in data["models"].items() if row["direct_usd"] is None]
    if unpriced:
        print(f"  no list price known for: {', '.join(unpriced)} (not in the totals)")
    print(
        f"  AWS (estimate): {human_usd(data['aws_usd'])} — Lambda, Step Functions, DynamoDB and S3 for about "
        f"{human_seconds(a['wall_seconds'])} at concurrency {a['concurrency']:,} and {a['latency_s']} s a request"
    )
    print(
        f"  input tokens: ~{a['bytes_per_token']} bytes of prompt a token, plus a few a message (within about "
        "20% for English prose; each provider, and the simulator, counts its own way)"
    )
    return EXIT_OK


def verify(args: argparse.Namespace) -> int:
    from sluice.verify import verify as check

    from local.checks import summary_file, verify_order

    paths = [need_file(Path(p)) for p in (args.input, args.results, args.errors)]
    verify_order(*paths)
    summary = summary_file(need_file(Path(args.summary))) if args.summary else None
    with paths[0].open("rb") as inputs, paths[1].open("rb") as results, paths[2].open("rb") as errors:
        report = check(inputs, results, errors, summary)
    print(report.describe())
    return EXIT_OK if report.ok else EXIT_JOB_FAILED


def _deployed(name: str) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        from local import deployed

        with deployed.aws_errors():
            return int(getattr(deployed, name)(args))

    return command


def _parser(sub: argparse._SubParsersAction, name: str, summary: str, text: str) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    return sub.add_parser(  # type: ignore[no-any-return]
        name,
        help=summary,
        description=textwrap.dedent(text),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _error_rate(raw: str) -> float:
    from sluice.settings import parse_error_rate

    try:
        return parse_error_rate(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{raw!r}: {exc}") from None


MAX_ERROR_RATE_HELP = (
    "share of the requests that may fail before the job ends COMPLETED_WITH_ERRORS (exit 9), "
    "0 to 1; 0.001 allows 1 in 1,000 (default: 0, any failed line)"
)


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode", help="how shards talk to the provider: direct, background, batch or auto (default: the environment's)"
    )
    p.add_argument("--model", help="send every request to this model, whatever its body says")
    p.add_argument("--concurrency", type=checks.positive_int, help="requests in flight for the whole job")
    p.add_argument("--map-concurrency", type=checks.positive_int, help="shards running at once")
    p.add_argument("--max-attempts", type=checks.positive_int, help="attempts per request before it goes to errors")
    p.add_argument(
        "--on-batch-incomplete",
        metavar="POLICY",
        help="what batch rows the provider did not finish become: direct (sent directly) or error",
    )
    p.add_argument(
        "--deadline-hours",
        type=checks.positive_number,
        help="the job must end within this many hours (auto avoids batch)",
    )
    p.add_argument("--max-error-rate", type=_error_rate, metavar="RATE", help=MAX_ERROR_RATE_HELP)


def _watch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--watch",
        action="store_true",
        help="follow the job until it ends; exit 0 if it SUCCEEDED, 9 if COMPLETED_WITH_ERRORS, 1 if not",
    )
    p.add_argument(
        "--interval", type=checks.positive_seconds, default=5.0, help="seconds between polls with --watch (default: 5)"
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"sluice {version('sluice')}"
    except PackageNotFoundError:
        return "sluice (not installed: run from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    from sluice.settings import MODES

    from local.deployed import add_env_options
    from local.sim_options import add_options as add_simulator_options

    parser = argparse.ArgumentParser(
        prog="sluice",
        description=textwrap.dedent(
            """\
            Push many LLM requests (OpenAI Batch JSONL) through an OpenAI-compatible provider.

            On this machine:        sluice run FILE · estimate FILE · verify · simulator
            On a deployed env:      sluice submit FILE --env dev · status · results · cancel · retry

            `sluice COMMAND --help` explains each, with an example.
            """
        ),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _parser(
        sub,
        "run",
        "run a job on this machine (moto + the same state machine and Lambda code)",
        """\
        Run FILE through the Sluice state machine locally: S3, DynamoDB and Step Functions
        are moto, in this process; the provider is OPENAI_BASE_URL/OPENAI_API_KEY if both
        are set, else the built-in simulator. Writes <name>.results.jsonl, .errors.jsonl,
        .summary.json and a <name>.report.html to open in a browser; nothing else persists.

        example:
          sluice run examples/reviews.jsonl --out out
        """,
    )
    p.add_argument("file", help="input JSONL in the OpenAI Batch input format")
    p.add_argument("--out", default="out", help="directory for results, errors, summary and report (default: out)")
    p.add_argument("--mode", choices=MODES, help="how shards talk to the provider (default: direct)")
    p.add_argument(
        "--concurrency",
        type=checks.positive_int,
        default=1000,
        help="requests in flight for the whole job (default: 1000)",
    )
    p.add_argument(
        "--map-concurrency", type=checks.positive_int, default=10, help="shards running at once (default: 10)"
    )
    p.add_argument("--shard-lines", type=checks.positive_int, default=5000, help="lines per shard (default: 5000)")
    p.add_argument(
        "--max-attempts",
        type=checks.positive_int,
        default=6,
        help="attempts per request before it goes to errors (default: 6)",
    )
    p.add_argument(
        "--request-timeout", type=checks.positive_seconds, default=120.0, help="seconds per attempt (default: 120)"
    )
    p.add_argument("--latency", type=checks.seconds, default=0.05, help="simulator latency in seconds (default: 0.05)")
    p.add_argument("--max-error-rate", type=_error_rate, metavar="RATE", help=MAX_ERROR_RATE_HELP)
    p.add_argument(
        "--allow-invalid", action="store_true", help="run even if some lines are invalid (they go to errors)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)

    s = _parser(
        sub,
        "simulator",
        "start the provider simulator alone",
        """\
        Start the OpenAI-compatible provider SIMULATOR (not a real model) until Ctrl-C:
        chat completions, responses (background too), embeddings, files and batches, with
        injectable faults and RPM/TPM limits. Point any OpenAI client at it, or `sluice run`
        with OPENAI_BASE_URL set. GET/POST /sim/config reads or changes its settings while it runs.

        examples:
          sluice simulator --port 8000
          sluice simulator --port 8000 --rate-429 0.1 --rate-500 0.05 --jitter 0.2 --rpm 600
        """,
    )
    add_simulator_options(s)
    s.set_defaults(func=simulator)

    v = _parser(
        sub,
        "verify",
        "check that a job's outputs account for every input line exactly once, in order",
        """\
        Check invariant 1 on any job's outputs: every input line is in exactly one of RESULTS
        and ERRORS, results are in input order, and (with --summary) the counts agree.
        Exits 1 and lists the problems when they don't.

        example:
          sluice verify examples/reviews.jsonl out/reviews.results.jsonl out/reviews.errors.jsonl \\
            --summary out/reviews.summary.json
        """,
    )
    v.add_argument("input", help="the job's input JSONL")
    v.add_argument("results", help="its results file")
    v.add_argument("errors", help="its errors file")
    v.add_argument("--summary", help="its summary JSON, to check the counts too")
    v.set_defaults(func=verify)

    e = _parser(
        sub,
        "estimate",
        "count requests and tokens in a file and estimate what running it costs",
        """\
        Check FILE line by line (no AWS, no provider), then estimate tokens and cost by model:
        direct (and background) at list price, batch at half price, plus the AWS cost of the run.
        Prompt tokens are estimated from text size. Output tokens are a guess: the expected figure
        takes --output-tokens an answer (or the request's max_tokens if lower); the upper bound
        takes every max_tokens in full; the lower bound one token an answer.

        example:
          sluice estimate examples/reviews.jsonl --output-tokens 5
        """,
    )
    e.add_argument("file", help="input JSONL in the OpenAI Batch input format")
    e.add_argument("--model", help="price every request as this model (as `submit --model` would send it)")
    e.add_argument(
        "--output-tokens",
        type=checks.whole_number,
        default=300,
        help="expected answer length in tokens, capped by each request's max_tokens (default: 300)",
    )
    e.add_argument(
        "--concurrency",
        type=checks.positive_int,
        default=1000,
        help="requests in flight, for the AWS estimate (default: 1000)",
    )
    e.add_argument(
        "--latency",
        type=checks.positive_seconds,
        default=2.0,
        help="seconds a request takes, for the AWS estimate (default: 2)",
    )
    e.add_argument(
        "--shard-lines",
        type=checks.positive_int,
        default=5000,
        help="lines per shard, for the AWS estimate (default: 5000)",
    )
    e.add_argument("--allow-invalid", action="store_true", help="estimate the valid lines even if some are invalid")
    e.add_argument("--json", action="store_true", help="print the estimate as JSON")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=estimate)

    u = _parser(
        sub,
        "submit",
        "upload a file to a deployed environment's inbox; prints the job id",
        f"""\
        Check FILE locally, then upload it to s3://<bucket>/inbox/<name>.jsonl of the environment
        with the options as object metadata (sluice-mode, sluice-model, ...). The S3 event starts
        the job; stdout gets its id (the same file content under the same name is one job, ever).

        example:
          JOB=$(sluice submit examples/reviews.jsonl --env dev --mode background)
          sluice status "$JOB" --env dev --watch && sluice results "$JOB" --env dev --out out

        {DEPLOYED_NOTE.replace(chr(10), chr(10) + "        ")}
        """,
    )
    u.add_argument("file", help="input JSONL in the OpenAI Batch input format")
    u.add_argument("--name", help="object name under inbox/ (default: the file's name; .jsonl is added)")
    _job_options(u)
    u.add_argument(
        "--allow-invalid", action="store_true", help="upload even if some lines are invalid (they go to errors)"
    )
    _watch_options(u)
    u.add_argument("--quiet", action="store_true", help="no progress bars")
    add_env_options(u)
    u.set_defaults(func=_deployed("submit"))

    st = _parser(
        sub,
        "status",
        "show a job's progress (or recent jobs, or one request)",
        f"""\
        Without JOB: the most recent jobs. With JOB: counts, per-shard state, throughput and
        ETA; --watch follows it to the end. With --item CUSTOM_ID: one request's state,
        attempts, provider id and last error.

        examples:
          sluice status --env dev
          sluice status reviews-0123456789ab --env dev --watch
          sluice status reviews-0123456789ab --env dev --item review-17

        {DEPLOYED_NOTE.replace(chr(10), chr(10) + "        ")}
        """,
    )
    st.add_argument("job", nargs="?", help="job id (as `sluice submit` printed it)")
    st.add_argument("--item", metavar="CUSTOM_ID", help="show one request of JOB")
    st.add_argument(
        "--input", metavar="FILE", help="with --item: find the request's line in this local copy of the input"
    )
    st.add_argument("--limit", type=checks.positive_int, default=20, help="how many recent jobs to list (default: 20)")
    st.add_argument("--json", action="store_true", help="print JSON instead of text")
    _watch_options(st)
    st.add_argument("--quiet", action="store_true", help="no progress bar with --watch")
    add_env_options(st)
    st.set_defaults(func=_deployed("status"))

    r = _parser(
        sub,
        "results",
        "download a finished job's results, errors and summary, and write its report",
        f"""\
        Download outbox/<name>.results.jsonl, .errors.jsonl and .summary.json of a job that has
        ended, and write <name>.report.html next to them (the last line links it).

        example:
          sluice results reviews-0123456789ab --env dev --out out

        {DEPLOYED_NOTE.replace(chr(10), chr(10) + "        ")}
        """,
    )
    r.add_argument("job", help="job id")
    r.add_argument("--out", default="out", help="directory to write to (default: out)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    add_env_options(r)
    r.set_defaults(func=_deployed("results"))

    c = _parser(
        sub,
        "cancel",
        "stop a running job; what finished stays in the results",
        f"""\
        Stop the job's execution, cancel its open batches and background responses at the
        provider (with the environment's API key), and end it CANCELLED: finished lines are in
        the results, every other line in the errors with code `cancelled`.

        example:
          sluice cancel reviews-0123456789ab --env dev

        {DEPLOYED_NOTE.replace(chr(10), chr(10) + "        ")}
        """,
    )
    c.add_argument("job", help="job id")
    c.add_argument("--reason", default="cancelled by the user", help="recorded in the summary and the errors")
    add_env_options(c)
    c.set_defaults(func=_deployed("cancel"))

    rt = _parser(
        sub,
        "retry",
        "start a new job from a finished job's failed lines",
        f"""\
        Take the lines of JOB that ended in errors (except invalid input, which would fail the
        same way; --code picks codes), copy them from the job's input, and upload them as
        inbox/<name>.retry-<n>.jsonl with sluice-parent-job=JOB and the parent's options.
        Prints the new job id.

        example:
          sluice retry reviews-0123456789ab --env dev --code retries_exhausted --watch

        {DEPLOYED_NOTE.replace(chr(10), chr(10) + "        ")}
        """,
    )
    rt.add_argument("job", help="job id")
    rt.add_argument("--code", action="append", metavar="CODE", help="retry only errors with this code (repeatable)")
    rt.add_argument("--input", metavar="FILE", help="take the lines from this local copy of the input instead of S3")
    _job_options(rt)
    _watch_options(rt)
    rt.add_argument("--quiet", action="store_true", help="no progress bars")
    add_env_options(rt)
    rt.set_defaults(func=_deployed("retry"))
    return parser


def _one_line_thread_errors(args: threading.ExceptHookArgs) -> None:
    """A background thread's crash (moto's interpreter, the simulator) as one line, not a traceback:
    what it means for the job shows in its outputs."""
    if os.environ.get("SLUICE_DEBUG"):
        threading.__excepthook__(args)
    elif args.exc_type is not SystemExit:
        name = args.thread.name if args.thread else "a thread"
        print(f"sluice: {name} stopped: {args.exc_type.__name__}: {args.exc_value}", file=sys.stderr)


class _OneLine(logging.Formatter):
    """A library's warning or error as one line; its traceback only with SLUICE_DEBUG=1."""

    def __init__(self) -> None:
        super().__init__("sluice: %(name)s: %(message)s")

    def formatException(self, ei: Any) -> str:
        return super().formatException(ei) if os.environ.get("SLUICE_DEBUG") else ""

    def formatStack(self, stack_info: str) -> str:
        return super().formatStack(stack_info) if os.environ.get("SLUICE_DEBUG") else ""


def main(argv: list[str] | None = None) -> int:
    previous, threading.excepthook = threading.excepthook, _one_line_thread_errors
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        return _main(argv)
    finally:
        threading.excepthook = previous
        logging.getLogger().removeHandler(handler)


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("sluice: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # the reader (`| head`) has gone; keep Python from complaining again when it flushes stdout
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    except OSError as exc:
        if exc.filename is None:
            return _unexpected(exc)
        print(f"sluice: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as exc:
        return _unexpected(exc)


def _unexpected(exc: BaseException) -> int:
    """Nothing the user did explains this one: one line and exit 70; the traceback on request."""
    if os.environ.get("SLUICE_DEBUG"):
        traceback.print_exception(exc)
    else:
        print(
            f"sluice: internal error: {type(exc).__name__}: {exc}\n"
            "sluice: this is a bug in sluice; run again with SLUICE_DEBUG=1 for the details to report",
            file=sys.stderr,
        )
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
