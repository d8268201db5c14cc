"""`sluice`: run a job on this machine, or submit, follow, fetch, cancel and retry jobs of a
deployed environment; estimate what a file will cost; start the provider simulator.

Imports are deferred to the command that needs them, so `--help` and the quick commands
start fast.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from local.console import (
    EXIT_CODES_HELP,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    CliError,
    file_link,
    human_seconds,
    human_usd,
    need_file,
    say,
)

# kept importable from here: older scripts and tests use them
__all__ = ["EXIT_INPUT", "EXIT_JOB_FAILED", "EXIT_OK", "CliError", "build_parser", "main"]

DEPLOYED_NOTE = (
    "works on a deployed environment (the stack Sluice-<env>). A local `sluice run` keeps\n"
    "nothing once it exits: its outputs and report are in its --out directory."
)


@contextmanager
def provider(latency_s: float) -> Iterator[tuple[str, str, str]]:
    """The user's provider when OPENAI_BASE_URL and OPENAI_API_KEY are set, else the simulator."""
    base_url = os.environ.get("OPENAI_BASE_URL")
    api_key = os.environ.get("OPENAI_API_KEY")
    if base_url and api_key:
        yield base_url, api_key, f"provider: {base_url}"
        return
    from local.simulator import SimConfig, SimulatorServer

    with SimulatorServer(SimConfig(latency_s=latency_s)) as sim:
        yield sim.base_url, "sk-simulator", f"provider: built-in SIMULATOR at {sim.base_url} (not a real model)"


def run(args: argparse.Namespace) -> int:
    path = need_file(Path(args.file))
    from sluice.plan import job_id_for

    from local.cloud import LocalCloud, LocalSettings
    from local.progress import Display, LiveCounts
    from local.report import write_report

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = LocalSettings(
        concurrency=args.concurrency,
        map_concurrency=args.map_concurrency,
        shard_lines=args.shard_lines,
        max_attempts=args.max_attempts,
        request_timeout_s=args.request_timeout,
    )
    metadata = {"sluice-mode": args.mode} if args.mode else {}
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
            with display:

                def tick() -> None:
                    # the display redraws on its own thread; the job row is read only until Plan has counted the lines
                    if counts.total is None:
                        requests = (cloud.job(job_id) or {}).get("requests")
                        counts.total = int(requests) if requests is not None else None

                try:
                    final = cloud.wait(execution, on_tick=tick)
                except KeyboardInterrupt:
                    # Ctrl-C cancels the job the way `sluice cancel` does a deployed one: what
                    # finished is kept, open provider work is cancelled, the rest is in errors
                    interrupted = True
                    say("\ncancelling: stopping the job and cancelling open work at the provider…")
                    _cancel_local(cloud, job_id, base_url, api_key)
                    final = cloud.wait(execution, timeout_s=30)
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
    summary = orjson.loads(written["summary"].read_bytes()) if "summary" in written else {}
    counts = summary.get("counts", {})
    say(
        f"job {job_id}: {final['status']} in {human_seconds(wall)} — "
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
    return EXIT_OK if final["status"] == "SUCCEEDED" else EXIT_JOB_FAILED


def _usage(summary: dict[str, Any]) -> str:
    """`, 43,210 tokens (41,000 in, 2,210 out), $0.0077 at list prices (est.)`: what the job used."""
    tokens = summary.get("tokens") or {}
    if not tokens:
        return ""
    tokens_in, tokens_out = int(tokens.get("input", 0)), int(tokens.get("output", 0))
    text = f", {tokens_in + tokens_out:,} tokens ({tokens_in:,} in, {tokens_out:,} out)"
    cost = (summary.get("cost_estimate_usd") or {}).get("provider")
    return text + (f", {human_usd(cost)} at list prices (est.)" if cost is not None else "")


def _cancel_local(cloud: Any, job_id: str, base_url: str, api_key: str) -> None:
    from handlers.runtime import runtime
    from sluice.cancel import cancel_job

    rt = runtime()
    cancel_job(s3=rt.s3, store=rt.store, sfn=rt.sfn, job_id=job_id, provider=lambda: (base_url, api_key))


def simulator(args: argparse.Namespace) -> int:
    from local import simulator as sim

    argv = ["--host", args.host, "--port", str(args.port), "--latency", str(args.latency)]
    return int(sim.main(argv) or 0)


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

    paths = [need_file(Path(p)) for p in (args.input, args.results, args.errors)]
    summary = orjson.loads(need_file(Path(args.summary)).read_bytes()) if args.summary else None
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


def _job_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode", help="how shards talk to the provider: direct, background, batch or auto (default: the environment's)"
    )
    p.add_argument("--model", help="send every request to this model, whatever its body says")
    p.add_argument("--concurrency", type=int, help="requests in flight for the whole job")
    p.add_argument("--map-concurrency", type=int, help="shards running at once")
    p.add_argument("--max-attempts", type=int, help="attempts per request before it goes to errors")
    p.add_argument(
        "--on-batch-incomplete",
        metavar="POLICY",
        help="what batch rows the provider did not finish become: direct (sent directly) or error",
    )
    p.add_argument("--deadline-hours", type=float, help="the job must end within this many hours (auto avoids batch)")


def _watch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--watch", action="store_true", help="follow the job until it ends; exit 0 if it SUCCEEDED, 1 if not"
    )
    p.add_argument("--interval", type=float, default=5.0, help="seconds between polls with --watch (default: 5)")


def build_parser() -> argparse.ArgumentParser:
    from sluice.settings import MODES

    from local.deployed import add_env_options

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
    p.add_argument("--concurrency", type=int, default=1000, help="requests in flight for the whole job (default: 1000)")
    p.add_argument("--map-concurrency", type=int, default=10, help="shards running at once (default: 10)")
    p.add_argument("--shard-lines", type=int, default=5000, help="lines per shard (default: 5000)")
    p.add_argument("--max-attempts", type=int, default=6, help="attempts per request before it goes to errors")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per attempt (default: 120)")
    p.add_argument("--latency", type=float, default=0.05, help="simulator latency in seconds (default: 0.05)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)

    s = _parser(
        sub,
        "simulator",
        "start the provider simulator alone",
        """\
        Start the OpenAI-compatible provider SIMULATOR (not a real model) until Ctrl-C.
        Point any OpenAI client at it, or `sluice run` with OPENAI_BASE_URL set.

        example:
          sluice simulator --port 8000
        """,
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000, help="port (0: any free one; the first line says which)")
    s.add_argument("--latency", type=float, default=0.05, help="seconds per answer (default: 0.05)")
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
        type=int,
        default=300,
        help="expected answer length in tokens, capped by each request's max_tokens (default: 300)",
    )
    e.add_argument(
        "--concurrency", type=int, default=1000, help="requests in flight, for the AWS estimate (default: 1000)"
    )
    e.add_argument(
        "--latency", type=float, default=2.0, help="seconds a request takes, for the AWS estimate (default: 2)"
    )
    e.add_argument(
        "--shard-lines", type=int, default=5000, help="lines per shard, for the AWS estimate (default: 5000)"
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
    st.add_argument("--limit", type=int, default=20, help="how many recent jobs to list (default: 20)")
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


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())
