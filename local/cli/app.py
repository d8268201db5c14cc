"""`sluice`: parse the arguments, run the chosen command, and turn what it raises into one
line on stderr and the exit code local.console documents."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any

from local.cli.parser import build_parser
from local.console import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, CliError


def _one_line_thread_errors(args: threading.ExceptHookArgs) -> None:
    """A background thread's crash (moto's interpreter, the simulator) as one line, not a traceback:
    what it means for the job shows in its outputs."""
    if os.environ.get("SLUICE_DEBUG"):
        threading.__excepthook__(args)
    elif args.exc_type is not SystemExit:
        name = args.thread.name if args.thread else "a thread"
        print(f"sluice: {name} stopped: {args.exc_type.__name__}: {args.exc_value}", file=sys.stderr)


class _OneLine(logging.Formatter):
    """A library's warning or error as one line; its traceback only with SLUICE_DEBUG=1."""

    def __init__(self) -> None:
        super().__init__("sluice: %(name)s: %(message)s")

    def formatException(self, ei: Any) -> str:
        return super().formatException(ei) if os.environ.get("SLUICE_DEBUG") else ""

    def formatStack(self, stack_info: str) -> str:
        return super().formatStack(stack_info) if os.environ.get("SLUICE_DEBUG") else ""


def main(argv: list[str] | None = None) -> int:
    previous, threading.excepthook = threading.excepthook, _one_line_thread_errors
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        return _main(argv)
    finally:
        threading.excepthook = previous
        logging.getLogger().removeHandler(handler)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        # `sluice` alone: what it can do, not only that a command is missing
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    # what a command reports as its own time includes importing its module (moto, boto3)
    args.started = time.monotonic()
    try:
        # the chosen command's module only: `run` brings moto, the deployed commands boto3
        command = importlib.import_module(f"local.cli.{args.command}")
        return int(command.run(args))
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
    except OSError as exc:
        if exc.filename is None:
            return _unexpected(exc)
        print(f"sluice: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as exc:
        return _unexpected(exc)


def _unexpected(exc: BaseException) -> int:
    """Nothing the user did explains this one: one line and exit 70; the traceback on request."""
    if os.environ.get("SLUICE_DEBUG"):
        traceback.print_exception(exc)
    else:
        print(
            f"sluice: internal error: {type(exc).__name__}: {exc}\n"
            "sluice: this is a bug in sluice; run again with SLUICE_DEBUG=1 for the details to report",
            file=sys.stderr,
        )
    return EXIT_INTERNAL
