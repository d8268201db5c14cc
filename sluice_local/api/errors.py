"""What the `sluice` command reports as an exit code, raised as an exception to a Python caller.

Each class carries the command's message, word for word, and its exit code (`code`). A job that
ends with errors, over its budget or failed is not an exception: it is the job's `status`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

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
    """Anything the `sluice` command would exit non-zero for before or instead of ending a job.

    Each subclass names its exit code in its header (`class NotFound(SluiceError, code=...)`),
    which is also how `error_for` finds it."""

    code = 1
    _by_code: ClassVar[dict[int, type[SluiceError]]] = {}

    def __init_subclass__(cls, *, code: int, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.code = code
        SluiceError._by_code[code] = cls

    def __init__(self, message: str, *, job: Any = None) -> None:
        super().__init__(message)
        self.message = message
        # the job, when it ran and wrote its outputs before this was found (a provider's refusal)
        self.job = job


class UsageError(SluiceError, code=EXIT_USAGE):
    """A bad option, or one Plan refused (exit 2)."""


class InputError(SluiceError, code=EXIT_INPUT):
    """A file missing or unreadable, or input that is not valid JSONL (exit 3)."""


class EnvironmentNotFound(SluiceError, code=EXIT_ENVIRONMENT):
    """No stack Sluice-<env>, or one without the outputs Sluice needs (exit 4)."""


class AWSError(SluiceError, code=EXIT_AWS):
    """No credentials or region, access denied, or another AWS error (exit 5)."""


class NotFound(SluiceError, code=EXIT_NOT_FOUND):
    """No such job, request or output (exit 6)."""


class NotReady(SluiceError, code=EXIT_NOT_READY):
    """The job has not ended yet (exit 7)."""


class ProviderError(SluiceError, code=EXIT_PROVIDER):
    """The provider could not be reached or refused the key, or refused the job's first answers (exit 8)."""


class OutputError(SluiceError, code=EXIT_OUTPUT):
    """An output could not be written (exit 73)."""


def error_for(code: int, message: str, *, job: Any = None) -> SluiceError:
    return SluiceError._by_code.get(code, SluiceError)(message, job=job)


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
