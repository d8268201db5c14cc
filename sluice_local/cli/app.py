"""`sluice`: parse the arguments, run the chosen command, and turn what it raises into one
line on stderr and the exit code sluice_local.console documents."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any

from sluice_local.cli.parser import build_parser
from sluice_local.console import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, CliError


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


_IMPORTED = time.monotonic()


def process_started() -> float:
    """When this process started, on the `time.monotonic()` clock: the interpreter's start-up and
    the imports before `main` count in a command's time as `time` counts them. Where /proc cannot
    say (not Linux), when this module was imported."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            # after the command name, which may hold spaces: field 22, the start in clock ticks since boot
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            age = float(uptime.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED
    now = time.monotonic()
    # an age far past this module's import is a clock /proc disagrees with, not a slow start-up
    return now - age if 0 <= age <= now - _IMPORTED + 60 else _IMPORTED


def main(argv: list[str] | None = None) -> int:
    previous, threading.excepthook = threading.excepthook, _one_line_thread_errors
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        code = _main(argv)
    finally:
        threading.excepthook = previous
        logging.getLogger().removeHandler(handler)
    if argv is None and sys.argv[1:2] == ["run"]:
        # the process is the command, and its local cloud leaves some 250,000 objects (moto's models,
        # botocore's) that the interpreter would take a second or more to tear down after the last
        # line is said, uncounted in the time the run gave: every output is written and closed by now
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        # `sluice` alone: what it can do, not only that a command is missing
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    # what a command reports as its own time is the process's, as `time` says it, when the process is
    # the command (argv from the command line); called from Python, from here, its module's import included
    args.started = process_started() if argv is None else time.monotonic()
    try:
        # the chosen command's module only: `run` brings moto, the deployed commands boto3
        command = importlib.import_module(f"sluice_local.cli.{args.command}")
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
