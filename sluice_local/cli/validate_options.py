"""`sluice run` and `sluice submit`'s output validation options (issue 33): the checks, the sends,
repair, a schema; and the job metadata they make."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from sluice.contract import INBOX_PREFIX, job_option_key, parse_validate

from sluice_local import checks
from sluice_local.console import EXIT_USAGE, CliError


def _checks(text: str) -> str:
    try:
        parse_validate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _schema_file(text: str) -> str:
    # only when the option is given: the check compiles the schema, as Plan would
    from sluice.send.output_check import schema_text

    if not text.endswith(".json") or not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a .json file")
    try:
        schema_text(Path(text).read_bytes())
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None
    return text


def validate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--validate",
        nargs="?",
        const="all",
        type=_checks,
        metavar="CHECKS",
        help="check every answer and send again the ones that fail: all (alone, the default) or some of "
        "json, schema, cut_short, refusal, empty, separated by commas",
    )
    p.add_argument(
        "--validate-attempts",
        type=checks.positive_int,
        metavar="N",
        help="sends an answer gets in all before it is an invalid_output error (default: 3)",
    )
    p.add_argument("--repair", action="store_true", help="a resend adds what was wrong as a follow-up user turn")
    p.add_argument(
        "--validate-schema",
        type=_schema_file,
        metavar="FILE",
        help="a JSON schema (.json) every answer must match, whatever the lines ask",
    )


def schema_key(path: str) -> str:
    """Where a job's schema file goes: beside the input, where Plan reads it (only a .jsonl under
    inbox/ starts a job)."""
    return f"{INBOX_PREFIX}schemas/{Path(path).name}"


def check_repair(args: argparse.Namespace) -> None:
    """Refuse --repair alone: it shapes --validate's resends, and without it would be dropped unsaid."""
    if getattr(args, "repair", False) and getattr(args, "validate", None) is None:
        raise CliError(
            "--repair adds what was wrong to a resend of --validate, which is not given: "
            "add --validate (all, or the checks to make)",
            EXIT_USAGE,
        )


def validate_metadata(args: argparse.Namespace) -> dict[str, str]:
    """The job metadata of the validation options `args` gives (none given: none)."""
    check_repair(args)
    metadata: dict[str, str] = {}
    if getattr(args, "validate", None) is not None:
        metadata[job_option_key("validate")] = args.validate
        metadata[job_option_key("validate-repair")] = "yes" if args.repair else "no"
    if getattr(args, "validate_schema", None):
        metadata[job_option_key("validate-schema")] = schema_key(args.validate_schema)
    if getattr(args, "validate_attempts", None) is not None:
        metadata[job_option_key("validate-attempts")] = str(args.validate_attempts)
    return metadata
