"""What every `sluice` command shares: exit codes, the error type, progress bars, number formats."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.contract import JobStatus

# Scripts branch on these; keep them stable and in step with EXIT_CODES_HELP.
EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_ENVIRONMENT = 4
EXIT_AWS = 5
EXIT_NOT_FOUND = 6
EXIT_NOT_READY = 7
EXIT_PROVIDER = 8
EXIT_COMPLETED_WITH_ERRORS = 9
EXIT_BUDGET_EXCEEDED = 10
EXIT_INTERRUPTED = 130
# sysexits' EX_CANTCREAT: an output that could not be written
EXIT_OUTPUT = 73
EXIT_INTERNAL = 70

EXIT_CODES_HELP = """\
exit codes:
  0    done (for `run`, `status --watch`, `submit --watch`: the job SUCCEEDED)
  1    the job ended FAILED, or CANCELLED by `sluice cancel` (`verify`: the outputs miss or
       repeat lines); a `run` stopped by a signal exits 128 + the signal (below)
  2    bad arguments or options, or a --mode the --provider has no API for (`run` and
       `submit` refuse it before anything is sent; a `run` whose job Plan refused for its
       options ends FAILED and exits 2 too)
  3    a file missing or unreadable, or input not valid JSONL (the first bad lines are listed)
  4    unknown environment: no CloudFormation stack Sluice-<env>, or it lacks an output
  5    AWS: no credentials or region, access denied, or another AWS error
  6    not found: no such job, request (custom_id) or output
  7    not ready: the job is still running
  8    provider: `run` could not reach it or it refused the key (nothing was sent), or the
       job's first answers were all the same refusal (a wrong URL path, model or key): the
       job stopped sending and `run` says the provider's message and the likely cause;
       `cancel`: the job is cancelled, but the provider refused some cancels (listed)
  9    the job ended COMPLETED_WITH_ERRORS: every line is in the outputs, but more failed
       than --max-error-rate allows (default 0: any failed line)
  10   the job ended BUDGET_EXCEEDED: its --budget was spent; the lines it did not send are
       errors `budget_exceeded` (deployed, `sluice retry JOB --budget USD` sends them; after
       `run`, run the file again with a higher --budget: the response cache answers the rest)
  73   an output could not be written (no space left on the device, no permission): the
       message names the file; none is left half-written
  70   internal error: a bug in sluice (SLUICE_DEBUG=1 shows the traceback; please report it)
  130  interrupted by Ctrl-C; for `run`, 143 for SIGTERM and 129 for SIGHUP: the job is
       CANCELLED, its outputs hold every answer the provider gave, the other lines are errors
       `cancelled`
"""


def job_exit_code(status: str) -> int:
    """The exit code for how a job ended: SUCCEEDED 0, COMPLETED_WITH_ERRORS 9, BUDGET_EXCEEDED 10, else 1."""
    if status == JobStatus.SUCCEEDED:
        return EXIT_OK
    if status == JobStatus.BUDGET_EXCEEDED:
        return EXIT_BUDGET_EXCEEDED
    return EXIT_COMPLETED_WITH_ERRORS if status == JobStatus.COMPLETED_WITH_ERRORS else EXIT_JOB_FAILED


class CliError(Exception):
    """A failure the user can act on: printed as one message, exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def write_output(path: Path, data: bytes) -> Path:
    """`data` at `path` whole, or nothing there: a file cut short by a full disk would read as a
    complete one, so it is written beside its name and renamed into place once all of it is down."""

    def fill(partial: Path) -> bool:
        with open(partial, "wb") as file:
            file.write(data)
        return True

    written = download_output(path, fill)
    assert written is not None
    return written


def download_output(path: Path, fill: Callable[[Path], bool]) -> Path | None:
    """`path` written whole by `fill` (given the file to write; False: there is nothing to
    write), as `write_output` writes it: beside its name, renamed into place once all is down."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        if not fill(partial):
            return None
        os.replace(partial, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            partial.unlink()
        why = exc.strerror or str(exc)
        raise CliError(f"could not write {path}: {why}; nothing of it was left in place", EXIT_OUTPUT) from exc
    return path


def say(message: str = "") -> None:
    """Human-facing lines go to stderr; stdout is kept for what scripts capture (ids, paths)."""
    print(message, file=sys.stderr, flush=True)


def progress(*, total: float | None, unit: str, desc: str | None = None, quiet: bool = False) -> Any:
    """A progress bar on stderr; tqdm's `disable=None` hides it when stderr is not a terminal."""
    from tqdm import tqdm

    scale = unit == "B"
    return tqdm(
        total=total,
        unit=unit,
        unit_scale=scale,
        unit_divisor=1024 if scale else 1000,
        desc=desc,
        disable=True if quiet else None,
        dynamic_ncols=True,
        file=sys.stderr,
        leave=False,
    )


def human_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def human_usd(value: float | None) -> str:
    """$12.50, $0.0077, $0.000042: cents above a dollar, else at least two significant digits."""
    if value is None:
        return "—"
    if value == 0:
        return "$0"
    if value >= 1:
        return f"${value:,.2f}"
    decimals = max(4, 1 - math.floor(math.log10(value)))
    return f"${value:.{decimals}f}"


def file_link(path: Path) -> str:
    """A file:// URI: most terminals make it clickable, and it opens in any browser."""
    return path.resolve().as_uri()


def need_file(path: Path) -> Path:
    if not path.exists():
        raise CliError(f"no such file: {path}", EXIT_INPUT)
    if not path.is_file():
        raise CliError(f"not a file: {path}", EXIT_INPUT)
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_INPUT) from exc
    return path
