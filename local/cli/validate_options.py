"""`sluice run`'s output validation options (issue 33): the checks, the sends, repair, a schema."""

from __future__ import annotations

import argparse
import os

from sluice.contract import parse_validate

from local import checks


def _checks(text: str) -> str:
    try:
        parse_validate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _schema_file(text: str) -> str:
    if not text.endswith(".json") or not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a .json file")
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
