"""What `sluice` checks before it starts work: option values, the output directory, the files a
command was given, the provider. Each failure is one line that names what to fix, and an exit code.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from sluice_local.console import EXIT_INPUT, EXIT_USAGE, CliError

N = TypeVar("N", int, float)


def _parsed(text: str, kind: type) -> Any:
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _within(kind: type[N], allowed: Callable[[N], bool], refusal: str) -> Callable[[str], N]:
    """An option's type: `text` read as `kind`, refused with `refusal` (`{text}`: what was given)
    unless `allowed`."""

    def check(text: str) -> N:
        value: N = _parsed(text, kind)
        if not allowed(value):
            raise argparse.ArgumentTypeError(refusal.format(text=text))
        return value

    return check


positive_int = _within(int, lambda v: v >= 1, "{text} is not allowed: give 1 or more")
# 0 or more (rpm and tpm budgets, where 0 means none; seeds)
whole_number = _within(int, lambda v: v >= 0, "{text} is not allowed: give 0 or more")
port = _within(int, lambda v: 0 <= v <= 65535, "{text} is not a TCP port: give 0 (any free port) to 65535")
positive_seconds = _within(float, lambda v: v > 0, "{text} is not allowed: give a number of seconds above 0")
# 0 or more seconds (a latency or jitter, where 0 means none)
seconds = _within(float, lambda v: v >= 0, "{text} is not allowed: give 0 or more seconds")
positive_number = _within(float, lambda v: v > 0, "{text} is not allowed: give a number above 0")
fraction = _within(float, lambda v: 0.0 <= v <= 1.0, "{text} is not a share: give 0 to 1 (0.1 is 10%)")


def usable_out_dir(path: Path, flag: str = "--out") -> Path:
    """Refuse an output directory the run could not make or write, before any work is done and
    without making it: a run refused for its input leaves nothing behind."""
    if path.exists() and not path.is_dir():
        raise CliError(
            f"{flag} {path}: is a file, not a directory (give a directory; it is made if missing)", EXIT_USAGE
        )
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise CliError(f"{flag} {path}: {existing} is a file, not a directory", EXIT_USAGE)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path}: this user cannot write there", EXIT_USAGE)
    return path


def out_dir(path: Path, flag: str = "--out") -> Path:
    """The directory outputs go to, made if missing; checked before any work is done."""
    usable_out_dir(path, flag)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"{flag} {path}: cannot make the directory: {exc.strerror}", EXIT_USAGE) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path}: this user cannot write there", EXIT_USAGE)
    return path


def budget_needs_prices(model: str | None, file_models: set[str | None], default_model: str | None) -> None:
    """Refuse a --budget the job could not hold before the local cloud starts, as Plan would
    refuse it after (`sluice.plan.plan.check_budget_models`): a model with no known price could spend
    without limit. `file_models` are the models the file's lines name (None: a line names none)."""
    from sluice.core.costs import PRICED_MODELS
    from sluice.limits.budget import budget_models

    sent = {model} if model else {m or default_model for m in file_models}
    unpriced = budget_models(sent)
    if not unpriced:
        return
    names = ", ".join(repr(m) if m else "(no model)" for m in unpriced)
    where = "--model" if model else "the file's lines"
    raise CliError(
        f"--budget needs a price for every model the job sends to, and {names} ({where}) has none "
        f"({PRICED_MODELS}). Send the lines to a priced model with --model, or run without --budget",
        EXIT_USAGE,
    )


def _kind_of(path: Path) -> str | None:
    """What the first non-blank line of a JSONL file looks like: input, results, errors, or None."""
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            try:
                record = orjson.loads(raw.removeprefix(b"\xef\xbb\xbf"))
            except orjson.JSONDecodeError:
                return None
            if not isinstance(record, dict):
                return None
            if record.get("error") is not None:
                return "errors"
            if "response" in record:
                return "results"
            if "method" in record or "url" in record or "body" in record:
                return "input"
            return None
    return None


def verify_order(input_path: Path, results_path: Path, errors_path: Path) -> None:
    """`sluice verify` takes INPUT RESULTS ERRORS; files given in another order would only show
    as a page of breaches, so say that they look swapped."""
    given = {"INPUT": input_path, "RESULTS": results_path, "ERRORS": errors_path}
    wrong = []
    for slot, path in given.items():
        kind = _kind_of(path)
        if kind is not None and kind != slot.lower():
            wrong.append(f"{slot} {path} looks like {'an' if kind[0] in 'aeiou' else 'a'} {kind} file")
    if wrong:
        raise CliError(
            "the files look swapped: " + "; ".join(wrong) + ". The order is: sluice verify INPUT RESULTS ERRORS",
            EXIT_USAGE,
        )


def summary_file(path: Path) -> dict[str, Any]:
    try:
        summary = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise CliError(f"--summary {path}: not a job summary (not one JSON object: {exc})", EXIT_INPUT) from exc
    if not isinstance(summary, dict) or "counts" not in summary:
        raise CliError(f"--summary {path}: not a job summary (no counts)", EXIT_INPUT)
    return summary
