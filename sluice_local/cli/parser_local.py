"""The arguments, help and examples of the commands that work on this machine: `run`, `cache`,
`simulator`, `verify`, `estimate`."""

from __future__ import annotations

import argparse

from sluice.contract import DEFAULT_PROVIDER, LOCAL_SETTING_DEFAULTS, MAX_REQUEST_TIMEOUT_S, PROVIDERS, SETTING_DEFAULTS

from sluice_local import checks
from sluice_local.cli.help_text import PROVIDER_HELP
from sluice_local.cli.parser_options import (
    command_parser,
    deadline_options,
    job_options,
    request_timeout,
    with_default,
)
from sluice_local.cli.validate_options import validate_options
from sluice_local.sim_options import add_options as add_simulator_options


def _run(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = command_parser(
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
    job_options(p, {**LOCAL_SETTING_DEFAULTS, "provider": DEFAULT_PROVIDER})
    for flag, name, kind, text in (
        ("--shard-lines", "shard_lines", checks.positive_int, "lines per shard"),
        (
            "--request-timeout",
            "request_timeout_s",
            request_timeout,
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
    ch = command_parser(
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
    s = command_parser(
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
    v = command_parser(
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
    e = command_parser(
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
    # what the AWS estimate assumes of the run
    for flag, kind, default, text in (
        ("--concurrency", checks.positive_int, SETTING_DEFAULTS["concurrency"], "requests in flight"),
        ("--latency", checks.positive_seconds, 2.0, "seconds a request takes"),
        ("--shard-lines", checks.positive_int, SETTING_DEFAULTS["shard_lines"], "lines per shard"),
    ):
        e.add_argument(flag, type=kind, default=default, help=with_default(f"{text}, for the AWS estimate", default))
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
    deadline_options(e)
    e.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="with --deadline: where `sluice run` kept the batch turnarounds it measured (default: as `sluice run`)",
    )
    e.add_argument("--allow-invalid", action="store_true", help="estimate the valid lines even if some are invalid")
    e.add_argument("--json", action="store_true", help="print the estimate as JSON")
    e.add_argument("--quiet", action="store_true", help="no progress bar")


# in the order `sluice --help` lists them
LOCAL_COMMANDS = (_run, _cache, _simulator, _verify, _estimate)
