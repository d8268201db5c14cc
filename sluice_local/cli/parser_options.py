"""The options several `sluice` commands share (a job's, a deadline's, `--watch`, `--env`), the
checks of their values, and how a command's parser is made (`command_parser`)."""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Mapping
from typing import Any

from sluice.contract import (
    BATCH_INCOMPLETE_POLICIES,
    MAX_REQUEST_TIMEOUT_S,
    MODES,
    PROVIDERS,
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
from sluice_local.console import EXIT_CODES_HELP

DEPLOYED_NOTE = (
    "works on a deployed environment (the stack Sluice-<env>). A local `sluice run` keeps\n"
    "nothing once it exits: its outputs and report are in its --out directory."
)


def command_parser(sub: argparse._SubParsersAction, name: str, summary: str, text: str) -> argparse.ArgumentParser:  # type: ignore[type-arg]
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


def request_timeout(raw: str) -> float:
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


def job_options(p: argparse.ArgumentParser, defaults: Mapping[str, Any] | None = None) -> None:
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
    deadline_options(p)
    p.add_argument("--max-error-rate", type=_error_rate, metavar="RATE", help=MAX_ERROR_RATE_HELP)
    p.add_argument("--budget", dest="budget_usd", type=_budget, metavar="USD", help=BUDGET_HELP)


DEADLINE_HELP = (
    "the job must end by then: a duration (6h, 90m, 2d, 1h30m) or an ISO-8601 time with its zone "
    "(2025-06-01T09:00:00+02:00); Sluice picks batch, flex or direct per shard, cheapest first, cancels a "
    "batch that runs late and sends the rest direct, and refuses a deadline the key's rate cannot meet (exit 2)"
)


def deadline_options(p: argparse.ArgumentParser) -> None:
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


def watch_options(p: argparse.ArgumentParser) -> None:
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


def env_options(parser: argparse.ArgumentParser) -> None:
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


def deployed_text(text: str) -> str:
    """A deployed command's description: `text`, then what a deployed environment keeps."""
    return textwrap.dedent(text) + "\n" + DEPLOYED_NOTE + "\n"
