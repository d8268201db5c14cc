"""What the `sluice` command reports as an exit code, raised as an exception to a Python caller.

Each class carries the command's message, word for word, and its exit code (`code`). A job that
ends with errors, over its budget or failed is not an exception: it is the job's `status`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from sluice_local.console import (
    EXIT_AWS,
    EXIT_ENVIRONMENT,
    EXIT_INPUT,
    EXIT_NOT_FOUND,
    EXIT_NOT_READY,
    EXIT_OUTPUT,
    EXIT_PROVIDER,
    EXIT_USAGE,
    CliError,
)


class SluiceError(Exception):
    """Anything the `sluice` command would exit non-zero for before or instead of ending a job."""

    code = 1

    def __init__(self, message: str, *, job: Any = None) -> None:
        super().__init__(message)
        self.message = message
        # the job, when it ran and wrote its outputs before this was found (a provider's refusal)
        self.job = job


class UsageError(SluiceError):
    """A bad option, or one Plan refused (exit 2)."""

    code = EXIT_USAGE


class InputError(SluiceError):
    """A file missing or unreadable, or input that is not valid JSONL (exit 3)."""

    code = EXIT_INPUT


class EnvironmentNotFound(SluiceError):
    """No stack Sluice-<env>, or one without the outputs Sluice needs (exit 4)."""

    code = EXIT_ENVIRONMENT


class AWSError(SluiceError):
    """No credentials or region, access denied, or another AWS error (exit 5)."""

    code = EXIT_AWS


class NotFound(SluiceError):
    """No such job, request or output (exit 6)."""

    code = EXIT_NOT_FOUND


class NotReady(SluiceError):
    """The job has not ended yet (exit 7)."""

    code = EXIT_NOT_READY


class ProviderError(SluiceError):
    """The provider could not be reached or refused the key, or refused the job's first answers (exit 8)."""

    code = EXIT_PROVIDER


class OutputError(SluiceError):
    """An output could not be written (exit 73)."""

    code = EXIT_OUTPUT


_BY_CODE: dict[int, type[SluiceError]] = {
    cls.code: cls
    for cls in (UsageError, InputError, EnvironmentNotFound, AWSError, NotFound, NotReady, ProviderError, OutputError)
}


def error_for(code: int, message: str, *, job: Any = None) -> SluiceError:
    return _BY_CODE.get(code, SluiceError)(message, job=job)


class ArgumentError(Exception):
    """argparse's complaint, raised where the command would print its usage and exit 2."""


def raising_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`parser`, and every command's parser under it, raising its complaint rather than exiting."""

    def complain(message: str) -> Any:
        raise ArgumentError(message)

    parsers = [parser]
    while parsers:
        current = parsers.pop()
        current.error = complain  # type: ignore[method-assign]
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    return parser


@contextlib.contextmanager
def as_sluice_errors() -> Iterator[None]:
    """The command's failures as `SluiceError`s, with the messages and codes the command gives them."""
    try:
        yield
    except CliError as exc:
        raise error_for(exc.code, str(exc)) from exc
    except ArgumentError as exc:
        raise UsageError(str(exc)) from exc
    except OSError as exc:
        if exc.filename is None:
            raise
        raise InputError(f"{exc.filename}: {exc.strerror or exc}") from exc
