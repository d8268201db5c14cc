"""Every `sluice` command's arguments, help and examples, and the options several share.

Only light modules are imported here: the parser is built for every command, `--help` included,
and a command's own module (with moto, boto3 or aiohttp behind it) is imported once it is chosen.
"""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from sluice.contract import (
    BATCH_INCOMPLETE_POLICIES,
    DEFAULT_PROVIDER,
    LOCAL_SETTING_DEFAULTS,
    MAX_REQUEST_TIMEOUT_S,
    MODES,
    PROVIDERS,
    SETTING_DEFAULTS,
    STEPS,
    parse_budget,
    parse_error_rate,
)

from sluice_local import checks
from sluice_local.cli.help_text import (
    BUDGET_HELP,
    MAX_ATTEMPTS_HELP,
    MAX_ERROR_RATE_HELP,
    MODE_HELP,
    PROVIDER_HELP,
    modes_by_provider,
)
from sluice_local.cli.validate_options import validate_options
from sluice_local.console import EXIT_CODES_HELP
from sluice_local.sim_options import add_options as add_simulator_options

DEPLOYED_NOTE = (
    "works on a deployed environment (the stack Sluice-<env>). A local `sluice run` keeps\n"
    "nothing once it exits: its outputs and report are in its --out directory."
)


def _parser(sub: argparse._SubParsersAction, name: str, summary: str, text: str) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    return sub.add_parser(  # type: ignore[no-any-return]
        name,
        help=summary,
        description=textwrap.dedent(text),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # `--deadline 12h` must not be taken for `--deadline-hours`, nor any flag for another it begins
        allow_abbrev=False,
    )


def _error_rate(raw: str) -> float:
    try:
        return parse_error_rate(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{raw!r}: {exc}") from None


def _request_timeout(raw: str) -> float:
    value = checks.positive_seconds(raw)
    if value >= MAX_REQUEST_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"{raw} s leaves a shard no time to send: give under {MAX_REQUEST_TIMEOUT_S:g} s "
            f"(a shard Lambda's {STEPS['run_shard'].timeout_s} s less its safety margin)"
        )
    return value


def _budget(raw: str) -> float:
    try:
        return parse_budget(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _job_options(p: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None) -> None:
    """The job's options, alike on `run`, `submit` and `retry`: with `defaults` (a local run's), each
    takes and shows its default; without, the environment's (metadata left unset)."""

    def default(name: str) -> Any:
        return None if defaults is None else defaults[name]

    def shown(text: str, name: str) -> str:
        return with_default(text, defaults[name]) if defaults is not None else f"{text} (default: the environment's)"

    mode_help = f"{MODE_HELP}; auto never batches with --deadline-hours under 24; {modes_by_provider()}"
    p.add_argument("--mode", choices=MODES, help=shown(mode_help, "default_mode"))
    provider_help = PROVIDER_HELP + ("" if defaults else "; an environment takes the one its cdk.json names")
    p.add_argument("--provider", choices=PROVIDERS, default=default("provider"), help=shown(provider_help, "provider"))
    p.add_argument("--model", help="send every request to this model, whatever its body says (its body.model)")
    for flag, name, text in (
        ("--concurrency", "concurrency", "requests in flight for the whole job"),
        ("--map-concurrency", "map_concurrency", "shards running at once"),
        ("--max-attempts", "max_attempts", MAX_ATTEMPTS_HELP),
    ):
        p.add_argument(flag, type=checks.positive_int, default=default(name), help=shown(text, name))
    p.add_argument(
        "--on-batch-incomplete",
        choices=BATCH_INCOMPLETE_POLICIES,
        metavar="POLICY",
        help="what batch rows the provider did not finish become: direct (sent directly) or error",
    )
    p.add_argument(
        "--deadline-hours",
        type=checks.positive_number,
        help="the job must end within this many hours (auto avoids batch)",
    )
    _deadline_options(p)
    p.add_argument("--max-error-rate", type=_error_rate, metavar="RATE", help=MAX_ERROR_RATE_HELP)
    p.add_argument("--budget", dest="budget_usd", type=_budget, metavar="USD", help=BUDGET_HELP)


DEADLINE_HELP = (
    "the job must end by then: a duration (6h, 90m, 2d, 1h30m) or an ISO-8601 time with its zone "
    "(2025-06-01T09:00:00+02:00); Sluice picks batch, flex or direct per shard, cheapest first, cancels a "
    "batch that runs late and sends the rest direct, and refuses a deadline the key's rate cannot meet (exit 2)"
)


def _deadline_options(p: argparse.ArgumentParser) -> None:
    """`--deadline` and what its plan weighs: the key's rate and the batch turnaround expected."""
    p.add_argument("--deadline", metavar="WHEN", type=_deadline, help=DEADLINE_HELP)
    p.add_argument(
        "--batch-turnaround",
        metavar="DURATION",
        type=_duration,
        help="with --deadline: how long a batch is expected to take (default: measured, else the family's)",
    )
    p.add_argument(
        "--batch-cancel",
        metavar="DURATION",
        type=_duration,
        help="with --deadline: how long a cancelled batch is given to hand back its answers, the margin the "
        "cutover keeps for it (as metadata sluice-batch-cancel; default: the environment's batch_cancel_s)",
    )
    p.add_argument(
        "--rpm", type=checks.positive_int, help="the key's requests a minute for the job (as metadata sluice-rpm)"
    )
    p.add_argument("--tpm", type=checks.positive_int, help="the key's tokens a minute (as metadata sluice-tpm)")
    p.add_argument(
        "--flex-models",
        metavar="MODELS",
        help="with --deadline: models that take OpenAI's flex tier besides those Sluice knows (o3, o4-mini, the "
        "gpt-5 family, gpt-5.4, gpt-5.5), separated by commas (as metadata sluice-flex-models)",
    )


def _deadline(raw: str) -> str:
    import time

    from sluice.plan.deadline import DeadlineError, parse_deadline

    try:
        parse_deadline(raw, now=time.time(), name="--deadline")
    except DeadlineError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return raw


def _duration(raw: str) -> str:
    from sluice.plan.deadline import parse_duration

    seconds = parse_duration(raw)
    if not seconds:
        raise argparse.ArgumentTypeError(f"{raw!r}: expected a duration (30m, 2h, 1h30m)")
    return raw


def _watch_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--watch",
        action="store_true",
        help=(
            "follow the job until it ends; exit 0 if it SUCCEEDED, 9 if COMPLETED_WITH_ERRORS, "
            "10 if BUDGET_EXCEEDED, 1 if not"
        ),
    )
    p.add_argument(
        "--interval", type=checks.positive_seconds, default=5.0, help="seconds between polls with --watch (default: 5)"
    )


def _version() -> str:
    try:
        return f"sluice {version('sluice')}"
    except PackageNotFoundError:
        return "sluice (not installed: run from a source tree)"


def _env_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        default=os.environ.get("SLUICE_ENV", "dev"),
        help="environment: the CloudFormation stack Sluice-<env> (default: $SLUICE_ENV or dev)",
    )
    parser.add_argument("--region", help="AWS region (default: your AWS configuration)")
    parser.add_argument("--profile", help="AWS profile (default: your AWS configuration)")


def with_default(text: str, value: object) -> str:
    """`text (default: value)`, a number written as the user would type it (120, not 120.0)."""
    shown = f"{value:g}" if isinstance(value, float) else value
    return f"{text} (default: {shown})"


def build_parser() -> argparse.ArgumentParser:
    """Every command's arguments; `args.command` names the module of sluice_local.cli that runs it."""
    parser = argparse.ArgumentParser(
        prog="sluice",
        allow_abbrev=False,
        description=textwrap.dedent(
            """\
            Push many LLM requests (OpenAI Batch JSONL) through an LLM provider (--provider).

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
    for add_command in COMMANDS:
        add_command(sub)
    return parser


def _run(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = _parser(
        sub,
        "run",
        "run a job on this machine (moto + the same state machine and Lambda code)",
        """\
        Run FILE through the Sluice state machine locally: S3, DynamoDB and Step Functions
        are moto, in this process. With --provider openai (the default) the provider is
        OPENAI_BASE_URL when it is set (with OPENAI_API_KEY as its key when that is set too; a
        vLLM server needs none); with --provider anthropic it is ANTHROPIC_BASE_URL (with
        ANTHROPIC_API_KEY), as Anthropic's SDK reads them; with --provider gemini
        GOOGLE_GEMINI_BASE_URL (with GEMINI_API_KEY, else GOOGLE_API_KEY), as Google's SDK
        reads them; else the built-in simulator, which speaks every family. A mode the
        provider has no API for, and a line it cannot take, are refused before anything is
        sent. Writes <name>.results.jsonl, .errors.jsonl, .summary.json and a
        <name>.report.html to open in a browser; nothing else persists but the response cache.

        Ctrl-C cancels the job: no new line is sent, the requests in flight get up to 10 s to
        be answered (Ctrl-C again stops waiting), and the outputs hold every answer the
        provider gave; the other lines are errors `cancelled`. SIGTERM and SIGHUP do the
        same without the wait. The run then exits 128 + the signal: 130, 143 or 129.

        examples:
          sluice run examples/reviews.jsonl --out out
          sluice run big.jsonl --mode batch --model gpt-4o-mini --budget 5
          sluice run chat.jsonl --provider anthropic --model claude-3-5-haiku-latest
          sluice run chat.jsonl --provider gemini --model gemini-2.5-flash --deadline 6h
        """,
    )
    p.add_argument("file", help="input JSONL in the OpenAI Batch input format")
    p.add_argument("--out", default="out", help="directory for results, errors, summary and report (default: out)")
    _job_options(p, {**LOCAL_SETTING_DEFAULTS, "provider": DEFAULT_PROVIDER})
    for flag, name, kind, text in (
        ("--shard-lines", "shard_lines", checks.positive_int, "lines per shard"),
        (
            "--request-timeout",
            "request_timeout_s",
            _request_timeout,
            f"seconds per attempt, under {MAX_REQUEST_TIMEOUT_S:g} (a shard Lambda's time less its margin)",
        ),
    ):
        default = LOCAL_SETTING_DEFAULTS[name]
        # the default of --max-attempts (0, none) is said in its help
        p.add_argument(flag, type=kind, default=default, help=with_default(text, default) if default else text)
    validate_options(p)
    p.add_argument("--latency", type=checks.seconds, default=0.05, help="simulator latency in seconds (default: 0.05)")
    p.add_argument(
        "--sim-batch-turnaround",
        type=checks.seconds,
        metavar="SECONDS",
        help="the built-in simulator's batches take this long from created to ended (default: 0.6)",
    )
    p.add_argument(
        "--allow-invalid", action="store_true", help="run even if some lines are invalid (they go to errors)"
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print only how the job ended (and why, when it did not succeed): no status line, no file list",
    )
    # a directory for a cache the run does not use would be ignored without a word
    cache = p.add_mutually_exclusive_group()
    cache.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="the response cache's directory (default: $XDG_CACHE_HOME/sluice, else ~/.cache/sluice)",
    )
    cache.add_argument(
        "--no-cache",
        action="store_true",
        help="send every line and keep no answer (as metadata sluice-cache: off); for sampling requests",
    )


def _cache(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    ch = _parser(
        sub,
        "cache",
        "show or clear the local response cache",
        """\
        `sluice run` answers a line from the response cache when the same request (provider,
        endpoint, body after --model) was answered before, and keeps every new answer there.
        `stats` counts what it holds; `clear` deletes it, once you answer y (off a terminal,
        with --yes only).

        examples:
          sluice cache stats
          sluice cache clear --cache-dir .sluice-cache
          sluice cache clear --yes    # in a script: no one is asked
        """,
    )
    ch.add_argument("action", choices=("stats", "clear"), help="stats: count the answers kept; clear: delete them")
    ch.add_argument("--cache-dir", metavar="DIR", help="the cache's directory (default: as `sluice run`)")
    ch.add_argument("--json", action="store_true", help="print JSON instead of text")
    ch.add_argument("--yes", action="store_true", help="with clear: delete without asking (needed off a terminal)")


def _simulator(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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


def _verify(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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


def _estimate(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
          sluice estimate big.jsonl --deadline 6h --rpm 500      # which shards batch, which go direct
        """,
    )
    e.add_argument("file", help="input JSONL in the OpenAI Batch input format")
    e.add_argument("--model", help="price every request as this model (as `submit --model` would send it)")
    e.add_argument(
        "--provider",
        choices=PROVIDERS,
        default=DEFAULT_PROVIDER,
        help=with_default(PROVIDER_HELP + "; batch is priced only where the family has a Batch API", DEFAULT_PROVIDER),
    )
    e.add_argument(
        "--output-tokens",
        type=checks.whole_number,
        default=300,
        help="expected answer length in tokens, capped by each request's max_tokens (default: 300)",
    )
    concurrency = SETTING_DEFAULTS["concurrency"]
    e.add_argument(
        "--concurrency",
        type=checks.positive_int,
        default=concurrency,
        help=with_default("requests in flight, for the AWS estimate", concurrency),
    )
    e.add_argument(
        "--latency",
        type=checks.positive_seconds,
        default=2.0,
        help="seconds a request takes, for the AWS estimate (default: 2)",
    )
    shard_lines = SETTING_DEFAULTS["shard_lines"]
    e.add_argument(
        "--shard-lines",
        type=checks.positive_int,
        default=shard_lines,
        help=with_default("lines per shard, for the AWS estimate", shard_lines),
    )
    e.add_argument(
        "--invalid-rate",
        type=checks.fraction,
        metavar="RATE",
        help="with output validation: the expected share of answers that fail the checks and are sent again",
    )
    e.add_argument(
        "--validate-attempts",
        type=checks.positive_int,
        default=3,
        metavar="N",
        help="sends a line gets in all (default: 3)",
    )
    _deadline_options(e)
    e.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="with --deadline: where `sluice run` kept the batch turnarounds it measured (default: as `sluice run`)",
    )
    e.add_argument("--allow-invalid", action="store_true", help="estimate the valid lines even if some are invalid")
    e.add_argument("--json", action="store_true", help="print the estimate as JSON")
    e.add_argument("--quiet", action="store_true", help="no progress bar")


def _deployed(text: str) -> str:
    """A deployed command's description: `text`, then what a deployed environment keeps."""
    return textwrap.dedent(text) + "\n" + DEPLOYED_NOTE + "\n"


def _submit(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    u = _parser(
        sub,
        "submit",
        "upload a file to a deployed environment's inbox; prints the job id",
        _deployed(
            """\
            Check FILE locally, then upload it to s3://<bucket>/inbox/<name>.jsonl of the environment
            with the options as object metadata (sluice-mode, sluice-model, ...). The S3 event starts
            the job; stdout gets its id (the same file content under the same name is one job, ever).

            example:
              JOB=$(sluice submit examples/reviews.jsonl --env dev --mode background)
              sluice status "$JOB" --env dev --watch && sluice results "$JOB" --env dev --out out
            """
        ),
    )
    u.add_argument("file", help="input JSONL in the OpenAI Batch input format")
    u.add_argument("--name", help="object name under inbox/ (default: the file's name; .jsonl is added)")
    _job_options(u)
    validate_options(u)
    u.add_argument(
        "--allow-invalid", action="store_true", help="upload even if some lines are invalid (they go to errors)"
    )
    _watch_options(u)
    u.add_argument("--quiet", action="store_true", help="no progress bars")
    _env_options(u)


def _status(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    st = _parser(
        sub,
        "status",
        "show a job's progress (or recent jobs, or one request)",
        _deployed(
            """\
            Without JOB: the most recent jobs. With JOB: counts, per-shard state, throughput and
            ETA; --watch follows it to the end. With --item CUSTOM_ID: one request's state,
            attempts, provider id and last error.

            examples:
              sluice status --env dev
              sluice status reviews-0123456789ab --env dev --watch
              sluice status reviews-0123456789ab --env dev --item review-17
            """
        ),
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
    _env_options(st)


def _results(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = _parser(
        sub,
        "results",
        "download a finished job's results, errors and summary, and write its report",
        _deployed(
            """\
            Download outbox/<name>.results.jsonl, .errors.jsonl and .summary.json of a job that has
            ended, and write <name>.report.html next to them (the last line links it).

            example:
              sluice results reviews-0123456789ab --env dev --out out
            """
        ),
    )
    r.add_argument("job", help="job id")
    r.add_argument("--out", default="out", help="directory to write to (default: out)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    _env_options(r)


def _cancel(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = _parser(
        sub,
        "cancel",
        "stop a running job; what finished stays in the results",
        _deployed(
            """\
            Stop the job's execution, cancel its open batches and background responses at the
            provider (with the environment's API key), and end it CANCELLED: finished lines are in
            the results, every other line in the errors with code `cancelled`.

            example:
              sluice cancel reviews-0123456789ab --env dev
            """
        ),
    )
    c.add_argument("job", help="job id")
    c.add_argument("--reason", default="cancelled by the user", help="recorded in the summary and the errors")
    _env_options(c)


def _retry(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    rt = _parser(
        sub,
        "retry",
        "start a new job from a finished job's failed lines",
        _deployed(
            """\
            Take the lines of JOB that ended in errors (except invalid input, which would fail the
            same way; --code picks codes), copy them from the job's input, and upload them as
            inbox/<name>.retry-<n>.jsonl with sluice-parent-job=JOB and the parent's options.
            Prints the new job id.

            example:
              sluice retry reviews-0123456789ab --env dev --code retries_exhausted --watch
              sluice retry reviews-0123456789ab --env dev --budget 20 --watch   # after BUDGET_EXCEEDED
            """
        ),
    )
    rt.add_argument("job", help="job id")
    rt.add_argument("--code", action="append", metavar="CODE", help="retry only errors with this code (repeatable)")
    rt.add_argument("--input", metavar="FILE", help="take the lines from this local copy of the input instead of S3")
    _job_options(rt)
    _watch_options(rt)
    rt.add_argument("--quiet", action="store_true", help="no progress bars")
    _env_options(rt)


# in the order `sluice --help` lists them
COMMANDS = (_run, _cache, _simulator, _verify, _estimate, _submit, _status, _results, _cancel, _retry)
