"""AWS's documented quotas, asserted by the local cloud at every step.

moto implements the APIs, and only some of their limits. What AWS would refuse must fail a
local run first, loudly, with the quota named: every breach is recorded in a `Ledger` with a
message that starts "AWS quota:", and surfaces as the error AWS itself would give (a
ValidationException, `States.DataLimitExceeded`, `Sandbox.Timedout`, `Runtime.OutOfMemory`, `EMFILE`).

The patches to moto that check them live with moto's other patches in `sluice_local.moto_patches`.
The numbers, each from the page named above it:
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import tempfile
import threading
import tracemalloc
import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from unittest import mock

from sluice.contract import STEPS
from sluice.limits.flow import AWS_CLIENT_FDS, LAMBDA_FILE_DESCRIPTORS, RUNTIME_FDS

from sluice_local.ledger import MemoryTrace

KIB = 1024
MIB = 1024 * KIB

# https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html (task, state or execution input/output)
STATE_PAYLOAD_BYTES = 256 * KIB
# https://docs.aws.amazon.com/step-functions/latest/apireference/API_SendTaskSuccess.html (output: 262144)
TASK_OUTPUT_BYTES = 256 * KIB
# https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html (maximum execution history size)
HISTORY_EVENTS = 25_000
# https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html (synchronous payload, request and response)
LAMBDA_PAYLOAD_BYTES = 6 * MIB
# https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html (/tmp: 512 MB unless configured)
LAMBDA_TMP_BYTES = 512 * MIB
# https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html (item size)
DYNAMODB_ITEM_BYTES = 400 * KIB
# https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_BatchWriteItem.html (25 puts or deletes)
BATCH_WRITE_ITEMS = 25
# https://docs.aws.amazon.com/amazondynamodb/latest/APIReference/API_TransactWriteItems.html (up to 100 actions)
TRANSACT_WRITE_ITEMS = 100
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html (parts per upload; part size, none for the last)
S3_MAX_PARTS = 10_000
S3_MIN_PART_BYTES = 5 * MIB
# https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-putevent-size.html (PutEvents entry size)
EVENTBRIDGE_ENTRY_BYTES = 256 * KIB

# What a function's process holds before its handler allocates anything: a fresh Python 3.11
# importing every handler module measured 71 MB resident.
LAMBDA_RUNTIME_MB = 72

# History events per state, from the event types of
# https://docs.aws.amazon.com/step-functions/latest/apireference/API_HistoryEvent.html
EXECUTION_EVENTS = 2  # ExecutionStarted, ExecutionSucceeded | ExecutionFailed
STATE_EVENTS = 2  # <Type>StateEntered, <Type>StateExited
TASK_ATTEMPT_EVENTS = 3  # TaskScheduled, TaskStarted, TaskSucceeded | TaskFailed | TaskTimedOut
CALLBACK_ATTEMPT_EVENTS = 4  # the same and TaskSubmitted, for .waitForTaskToken
MAP_RUN_EVENTS = 2  # MapRunStarted, MapRunSucceeded | MapRunFailed


class QuotaExceeded(Exception):
    """A breach the local cloud reports itself (not through a service's own error)."""


def _n(value: float) -> str:
    return f"{value:,.0f}"


def size_text(limit: int) -> str:
    for unit, size in (("MiB", MIB), ("KiB", KIB)):
        if limit >= size and limit % size == 0:
            return f"{_n(limit)} bytes ({limit // size} {unit})"
    return f"{_n(limit)} bytes"


def json_size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    return len(text.encode())


@dataclass
class Ledger:
    """Every breach of a run, and the figures measured on the way (for tests and reports)."""

    breaches: list[str] = field(default_factory=list)
    history: dict[tuple[str, int | None], int] = field(default_factory=dict)
    fd_peaks: dict[str, int] = field(default_factory=dict)
    # bytes: the runtime plus the peak an invocation that ran alone added (see `memory`)
    memory_peaks: dict[str, int] = field(default_factory=dict)
    # the largest result a Distributed Map gathered, in bytes
    gathered_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def breach(self, message: str) -> str:
        with self._lock:
            self.breaches.append(message)
        return message

    def events(self, key: tuple[str, int | None], count: int) -> int:
        with self._lock:
            total = self.history.get(key, EXECUTION_EVENTS) + count
            self.history[key] = total
        return total

    def child_peak(self) -> int:
        """The most events any Map child (one shard) recorded."""
        return max((n for (_, index), n in self.history.items() if index is not None), default=0)

    def fd_peak(self, step: str, value: int) -> None:
        with self._lock:
            self.fd_peaks[step] = max(value, self.fd_peaks.get(step, 0))

    def memory_peak(self, step: str, value: int) -> None:
        with self._lock:
            self.memory_peaks[step] = max(value, self.memory_peaks.get(step, 0))


_current = threading.local()


def current_execution() -> tuple[str, int | None] | None:
    """The execution (and Map child) whose state this thread is evaluating."""
    return getattr(_current, "execution", None)


@contextmanager
def evaluating(key: tuple[str, int | None]) -> Iterator[None]:
    """Count what this thread does meanwhile against the execution (or Map child) `key`."""
    outer = current_execution()
    _current.execution = key
    try:
        yield
    finally:
        _current.execution = outer


class ChildThread(threading.Thread):
    """A thread that evaluates for the execution (or Map child) of the thread that made it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._execution = current_execution()

    def run(self) -> None:
        if self._execution is None:
            return super().run()
        with evaluating(self._execution):
            return super().run()


def history_message(key: tuple[str, int | None], total: int, state: str) -> str:
    who = f"Map child {key[1]}" if key[1] is not None else "the execution"
    return (
        f"AWS quota: Step Functions execution history is {_n(HISTORY_EVENTS)} events; "
        f"{who} reached {_n(total)} at state {state!r}"
    )


def payload_message(what: str, limit: int, source: str, size: int) -> str:
    return f"AWS quota: {what} is {size_text(limit)}; {source} {_n(size)} bytes"


# ---- file descriptors: sockets opened by one invocation, counted at their peak


class FdBudget:
    """The sockets one Lambda invocation holds open (its connections, the event loop's). moto
    opens none for the AWS SDK, so the SDK's pools are counted at their size, with the runtime's
    own descriptors (sluice.limits.flow)."""

    def __init__(self, ledger: Ledger, step: str) -> None:
        self.ledger = ledger
        self.step = step
        self.reserved = AWS_CLIENT_FDS + RUNTIME_FDS
        self.sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self.peak = self.reserved
        self.message: str | None = None

    def opened(self, sock: socket.socket) -> None:
        self.sockets.add(sock)
        held = self.reserved + sum(1 for s in list(self.sockets) if s.fileno() >= 0)
        self.peak = max(self.peak, held)
        if held > LAMBDA_FILE_DESCRIPTORS:
            self.message = self.message or self.ledger.breach(
                f"AWS quota: Lambda file descriptors are {_n(LAMBDA_FILE_DESCRIPTORS)}; {self.step} held {_n(held)} "
                f"({_n(held - self.reserved)} sockets and {self.reserved} for the runtime and AWS SDK pools)"
            )
            sock.close()
            raise OSError(errno.EMFILE, self.message)


_socket_init = socket.socket.__init__


def _counted_socket_init(self: socket.socket, *args: Any, **kwargs: Any) -> None:
    _socket_init(self, *args, **kwargs)
    budget: FdBudget | None = getattr(_current, "fds", None)
    if budget is not None:
        budget.opened(self)


# ---- /tmp: the files one invocation holds there, by their size


class TmpBudget:
    def __init__(self, ledger: Ledger, step: str) -> None:
        self.ledger = ledger
        self.step = step
        self.files: weakref.WeakSet[Any] = weakref.WeakSet()
        self.message: str | None = None

    def wrote(self) -> None:
        used = 0
        for handle in list(self.files):
            with contextlib.suppress(OSError, ValueError):
                used += os.fstat(handle.fileno()).st_size
        if used > LAMBDA_TMP_BYTES:
            self.message = self.message or self.ledger.breach(
                f"AWS quota: Lambda /tmp is {size_text(LAMBDA_TMP_BYTES)} as configured; {self.step} wrote {_n(used)}"
            )
            raise OSError(errno.ENOSPC, self.message)


class _TmpFile:
    """A temporary file whose writes are measured against the invocation's /tmp."""

    def __init__(self, handle: Any, budget: TmpBudget) -> None:
        self._handle = handle
        self._budget = budget
        budget.files.add(handle)

    def write(self, data: Any) -> int:
        written = int(self._handle.write(data))
        self._handle.flush()
        self._budget.wrote()
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._handle)

    def __enter__(self) -> _TmpFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


_temporary_file = tempfile.TemporaryFile
# rollover -> _check -> write -> moto's FakeKey.value, and a little room
_SPILL_DEPTH = 8


def _spilled_by_s3() -> bool:
    """The file is moto's: it keeps an S3 object over 5 MiB in a spooled temporary file, which is
    S3's own disk on AWS, however large, and never the calling Lambda's /tmp."""
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(_SPILL_DEPTH):
        if frame is None:
            return False
        if str(frame.f_globals.get("__name__", "")).startswith("moto."):
            return True
        frame = frame.f_back
    return False


def _measured_temporary_file(*args: Any, **kwargs: Any) -> Any:
    handle = _temporary_file(*args, **kwargs)
    budget: TmpBudget | None = getattr(_current, "tmp", None)
    return handle if budget is None or _spilled_by_s3() else _TmpFile(handle, budget)


@contextmanager
def invocation(ledger: Ledger, step: str) -> Iterator[tuple[FdBudget, TmpBudget]]:
    """Count the descriptors and /tmp of one in-process Lambda invocation on this thread."""
    budget = FdBudget(ledger, step)
    tmp = TmpBudget(ledger, step)
    outer = getattr(_current, "fds", None), getattr(_current, "tmp", None)
    _current.fds, _current.tmp = budget, tmp
    try:
        yield budget, tmp
    finally:
        _current.fds, _current.tmp = outer
        ledger.fd_peak(step, budget.peak)


class MemoryBudget:
    def __init__(self, step: str) -> None:
        self.step = step
        self.message: str | None = None
        # what the invocation held at its peak, when it ran alone: the runtime and the handler's
        # growth of the process (RSS), or with `trace` what its Python objects took (tracemalloc)
        self.used: int | None = None
        self.traced: int | None = None

    def held(self, *, traced: bool) -> int | None:
        """As traced (with the runtime) when tracing, else as RSS saw it; None when not measured."""
        if traced:
            return None if self.traced is None else self.traced + LAMBDA_RUNTIME_MB * MIB
        return self.used


def _status_bytes(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as status:
            for row in status:
                if row.startswith(field_name + ":"):
                    return int(row.split()[1]) * KIB
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    # https://www.kernel.org/doc/html/latest/filesystems/proc.html: writing 5 to clear_refs
    # resets the peak resident set size (VmHWM) to the current one
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


class _Residents:
    """Which invocations share the process right now.

    Memory is the process's, not a thread's: an invocation's peak is known only if nothing
    else ran in the process meanwhile. Plan, Merge, Notify, MarkFailed and the shard of a
    one-shard job run alone and are measured; Map children running side by side are not.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.started = 0


_residents = _Residents()


@contextmanager
def memory(ledger: Ledger, step: str, *, trace: bool = False) -> Iterator[MemoryBudget]:
    """Measure one in-process invocation's memory against the function's configured size; with
    `trace`, also what its Python objects took at their peak (exact where RSS is coarse, and slow)."""
    budget = MemoryBudget(step)
    with _residents.lock:
        _residents.running += 1
        _residents.started += 1
        mine = _residents.started
        first = _residents.running == 1
        base = _status_bytes("VmRSS") if first and _reset_peak() else None
        traced = MemoryTrace() if trace and first and not tracemalloc.is_tracing() else None
        if traced is not None:
            traced.start()
    try:
        yield budget
    finally:
        with _residents.lock:
            _residents.running -= 1
            alone = _residents.started == mine
            peak = _status_bytes("VmHWM") if alone and base is not None else None
            if traced is not None:
                held = traced.stop()
                budget.traced = held if alone else None
        if base is not None and peak is not None:
            used = LAMBDA_RUNTIME_MB * MIB + max(0, peak - base)
            budget.used = used
            ledger.memory_peak(step, used)
            limit = STEPS[step].memory_mb * MIB
            if used > limit:
                handler_mb = used // MIB - LAMBDA_RUNTIME_MB
                budget.message = ledger.breach(
                    f"AWS quota: Lambda memory for {step} is {_n(STEPS[step].memory_mb)} MB as configured; "
                    f"it used {_n(used // MIB)} MB ({LAMBDA_RUNTIME_MB} MB runtime and {_n(handler_mb)} MB "
                    "allocated by the handler)"
                )


# ---- DynamoDB: item size computed as the service does


def _attribute_size(value: dict[str, Any]) -> int:
    """https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/CapacityUnitCalculations.html"""
    (kind, inner), *_ = value.items()
    if kind == "S":
        return len(str(inner).encode())
    if kind == "N":
        digits = Decimal(str(inner)).as_tuple().digits
        return (len(digits) + 1) // 2 + 1
    if kind == "B":
        return len(inner) if isinstance(inner, (bytes, bytearray)) else len(str(inner))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "NS", "BS"):
        return sum(_attribute_size({kind[0]: v}) for v in inner)
    if kind == "L":
        return 3 + sum(1 + _attribute_size(v) for v in inner)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + _attribute_size(v) for k, v in inner.items())
    return len(json.dumps(inner, default=str).encode())


def item_size(item: dict[str, Any]) -> int:
    return sum(len(name.encode()) + _attribute_size(value) for name, value in item.items())


def dynamodb_breach(action: str, body: dict[str, Any]) -> str | None:
    """The quota a DynamoDB request breaks, or None."""
    items: list[dict[str, Any]] = []
    if action == "BatchWriteItem":
        requests = [r for table in body.get("RequestItems", {}).values() for r in table]
        if len(requests) > BATCH_WRITE_ITEMS:
            return f"AWS quota: DynamoDB BatchWriteItem takes at most {BATCH_WRITE_ITEMS} requests; got {len(requests)}"
        items = [r["PutRequest"]["Item"] for r in requests if "PutRequest" in r]
    elif action == "TransactWriteItems":
        actions = body.get("TransactItems", [])
        if len(actions) > TRANSACT_WRITE_ITEMS:
            quota = f"DynamoDB TransactWriteItems takes at most {TRANSACT_WRITE_ITEMS} actions"
            return f"AWS quota: {quota}; got {len(actions)}"
        items = [a["Put"]["Item"] for a in actions if "Put" in a]
    elif action == "PutItem":
        items = [body.get("Item", {})]
    for item in items:
        size = item_size(item)
        if size > DYNAMODB_ITEM_BYTES:
            return payload_message("DynamoDB item size", DYNAMODB_ITEM_BYTES, f"{action} wrote an item of", size)
    return None


def action_method(action: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in action).lstrip("_")


def eventbridge_entry_size(entry: dict[str, Any]) -> int:
    """https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-putevent-size.html"""
    size = 14 if entry.get("Time") is not None else 0
    for name in ("Source", "DetailType", "Detail"):
        size += len(str(entry.get(name) or "").encode())
    return size + sum(len(r.encode()) for r in entry.get("Resources") or [])


@contextmanager
def enforced(ledger: Ledger) -> Iterator[Ledger]:
    """What a Lambda's sandbox refuses, measured per invocation while the local cloud runs: its
    file descriptors and its /tmp. The quotas of the AWS services themselves are checked inside
    moto, by `sluice_local.moto_quotas.quota_checks`."""
    with (
        mock.patch.object(socket.socket, "__init__", _counted_socket_init),
        # SpooledTemporaryFile spills into tempfile.TemporaryFile
        mock.patch.object(tempfile, "TemporaryFile", _measured_temporary_file),
    ):
        yield ledger
