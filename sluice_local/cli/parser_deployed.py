"""The arguments, help and examples of the commands that work on a deployed environment: `submit`,
`status`, `results`, `cancel`, `retry`."""

from __future__ import annotations

import argparse

from sluice_local import checks
from sluice_local.cli.parser_options import command_parser, deployed_text, env_options, job_options, watch_options
from sluice_local.cli.validate_options import validate_options


def _submit(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    u = command_parser(
        sub,
        "submit",
        "upload a file to a deployed environment's inbox; prints the job id",
        deployed_text(
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
    job_options(u)
    validate_options(u)
    u.add_argument(
        "--allow-invalid", action="store_true", help="upload even if some lines are invalid (they go to errors)"
    )
    watch_options(u)
    u.add_argument("--quiet", action="store_true", help="no progress bars")
    env_options(u)


def _status(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    st = command_parser(
        sub,
        "status",
        "show a job's progress (or recent jobs, or one request)",
        deployed_text(
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
    watch_options(st)
    st.add_argument("--quiet", action="store_true", help="no progress bar with --watch")
    env_options(st)


def _results(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    r = command_parser(
        sub,
        "results",
        "download a finished job's results, errors and summary, and write its report",
        deployed_text(
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
    env_options(r)


def _cancel(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    c = command_parser(
        sub,
        "cancel",
        "stop a running job; what finished stays in the results",
        deployed_text(
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
    env_options(c)


def _retry(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    rt = command_parser(
        sub,
        "retry",
        "start a new job from a finished job's failed lines",
        deployed_text(
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
    job_options(rt)
    watch_options(rt)
    rt.add_argument("--quiet", action="store_true", help="no progress bars")
    env_options(rt)


# in the order `sluice --help` lists them
DEPLOYED_COMMANDS = (_submit, _status, _results, _cancel, _retry)
