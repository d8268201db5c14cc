"""AWS's documented quotas, asserted by the local cloud at every step.

moto implements the APIs, and only some of their limits. What AWS would refuse must fail a
local run first, loudly, with the quota named: every breach is recorded in a `Ledger` with a
message that starts "AWS quota:", and surfaces as the error AWS itself would give (a
ValidationException, `States.DataLimitExceeded`, `Sandbox.Timedout`, `Runtime.OutOfMemory`, `EMFILE`).

All of the patches to moto live in `enforced()`. The numbers, each from the page named above it:
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from unittest import mock

from sluice.limits import AWS_CLIENT_FDS, LAMBDA_FILE_DESCRIPTORS, RUNTIME_FDS

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

# Each step's timeout (seconds) as infra/functions.py STEPS configures it; importing the CDK on
# every `sluice run` would cost seconds, so tests/infra keeps this copy equal to STEPS.
STEP_TIMEOUT_S = {
    "plan": 900,
    "run_shard": 900,
    "submit": 900,
    "await_shard": 30,
    "collect": 900,
    "submit_batch": 900,
    "collect_batch": 900,
    "merge": 900,
    "notify": 30,
    "mark_failed": 900,
}

# Each step's memory (MB) as infra/functions.py STEPS configures it; tests/infra keeps it equal.
STEP_MEMORY_MB = {step: 1024 for step in STEP_TIMEOUT_S} | {"run_shard": 1769}
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
    own descriptors (sluice.limits)."""

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


def _measured_temporary_file(*args: Any, **kwargs: Any) -> Any:
    handle = _temporary_file(*args, **kwargs)
    budget: TmpBudget | None = getattr(_current, "tmp", None)
    return handle if budget is None else _TmpFile(handle, budget)


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
def memory(ledger: Ledger, step: str) -> Iterator[MemoryBudget]:
    """Measure one in-process invocation's memory against the function's configured size."""
    budget = MemoryBudget(step)
    with _residents.lock:
        _residents.running += 1
        _residents.started += 1
        mine = _residents.started
        base = _status_bytes("VmRSS") if _residents.running == 1 and _reset_peak() else None
    try:
        yield budget
    finally:
        with _residents.lock:
            _residents.running -= 1
            alone = base is not None and _residents.started == mine
            peak = _status_bytes("VmHWM") if alone else None
        if base is not None and peak is not None:
            used = LAMBDA_RUNTIME_MB * MIB + max(0, peak - base)
            ledger.memory_peak(step, used)
            limit = STEP_MEMORY_MB[step] * MIB
            if used > limit:
                handler_mb = used // MIB - LAMBDA_RUNTIME_MB
                budget.message = ledger.breach(
                    f"AWS quota: Lambda memory for {step} is {_n(STEP_MEMORY_MB[step])} MB as configured; "
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


# ---- the patches: one place


@contextmanager
def enforced(ledger: Ledger) -> Iterator[Ledger]:
    """Patch moto (while the local cloud runs) so that it refuses what AWS refuses."""
    from moto.dynamodb import responses as dynamodb_responses
    from moto.dynamodb.exceptions import MockValidationException
    from moto.events import models as events_models
    from moto.events.exceptions import ValidationException as EventsValidation
    from moto.s3 import models as s3_models
    from moto.s3.exceptions import S3ClientError
    from moto.stepfunctions.exceptions import ValidationException as SfnValidation
    from moto.stepfunctions.parser import models as sfn_models
    from moto.stepfunctions.parser.api import ExecutionFailedEventDetails, HistoryEventType
    from moto.stepfunctions.parser.asl.component.common.error_name import error_equals_decl
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state import state as state_module
    from moto.stepfunctions.parser.asl.component.state.exec import execute_state
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration import (
        distributed_iteration_component as distributed,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import state_task, state_task_lambda
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.resource import ResourceCondition
    from moto.stepfunctions.parser.asl.component.state.state_type import StateType
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails

    def terminal(env: Any, typ: Any, cause: str) -> FailureEventException:
        return FailureEventException(
            FailureEvent(
                env=env,
                error_name=StatesErrorName(typ=typ),
                event_type=HistoryEventType.ExecutionFailed,
                event_details=EventDetails(  # type: ignore[typeddict-item]
                    executionFailedEventDetails=ExecutionFailedEventDetails(error=typ.to_name(), cause=cause)
                ),
            )
        )

    # States.ALL catches neither States.DataLimitExceeded nor States.Runtime
    # (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html); moto's does.
    uncatchable = [
        StatesErrorName(typ=StatesErrorNameType.StatesStatesDataLimitExceeded),
        StatesErrorName(typ=StatesErrorNameType.StatesRuntime),
    ]
    equals_eval = error_equals_decl.ErrorEqualsDecl._eval_body

    def error_equals(self: Any, env: Any) -> None:
        error_name = env.stack[-1]
        equals_eval(self, env)
        if error_name in uncatchable and error_name not in self.error_names:
            env.stack[-1] = False

    # state input and output, task results: moto checks 256 KiB with a message that names no size
    def sized(original: Callable[..., None], what: str, verb: str) -> Callable[..., None]:
        def verify(self: Any, env: Any, value: Any) -> None:
            size = json_size(value)
            if size < STATE_PAYLOAD_BYTES:
                return
            name = getattr(self, "name", None) or getattr(getattr(self, "resource", None), "resource_arn", "?")
            cause = ledger.breach(
                payload_message(f"Step Functions {what}", STATE_PAYLOAD_BYTES, f"{name} {verb}", size)
            )
            try:
                original(self, env, value)
            except FailureEventException as exc:
                details: dict[str, Any] = dict(exc.failure_event.event_details or {})
                for detail in details.values():
                    if isinstance(detail, dict) and "cause" in detail:
                        detail["cause"] = cause
                raise
            raise terminal(env, StatesErrorNameType.StatesStatesDataLimitExceeded, cause)

        return verify

    # the history: every state visit, counted against the execution (or Map child) it runs in
    state_eval = state_module.CommonStateField._eval_body

    def counted_state(self: Any, env: Any) -> None:
        context = env.states.context_object.context_object_data
        item = context.get("Map", {}).get("Item", {})
        key = (str(context.get("Execution", {}).get("Id", "")), item.get("Index"))
        outer = current_execution()
        _current.execution = key
        try:
            extra = MAP_RUN_EVENTS if self.state_type == StateType.Map else 0
            total = ledger.events(key, STATE_EVENTS + extra)
            if total > HISTORY_EVENTS:
                cause = ledger.breach(history_message(key, total, self.name))
                raise terminal(env, StatesErrorNameType.StatesRuntime, cause)
            state_eval(self, env)
        finally:
            _current.execution = outer

    # each attempt of a Task (a retry is another) runs through here, on the state's thread
    evaluate = execute_state.ExecutionState._evaluate_with_timeout

    def counted_attempt(self: Any, env: Any) -> None:
        key = current_execution()
        if key is not None and isinstance(self, state_task.StateTask):
            waits = getattr(self.resource, "condition", None) == ResourceCondition.WaitForTaskToken
            ledger.events(key, CALLBACK_ATTEMPT_EVENTS if waits else TASK_ATTEMPT_EVENTS)
        evaluate(self, env)

    # the Distributed Map gathers every child's output into its own result, before ResultPath
    map_run = distributed.DistributedIterationComponent._map_run

    def gathered(self: Any, env: Any, eval_input: Any) -> None:
        map_run(self, env, eval_input)
        # moto records ToleratedFailureCount/Percentage but never fails the Map on them
        record = eval_input.map_run_record
        failed, total = record.item_counter.failed.get(), record.item_counter.total.get()
        tolerated_count, tolerated_percentage = record.tolerated_failure_count, record.tolerated_failure_percentage
        if failed and failed > tolerated_count and 100.0 * failed / max(total, 1) > tolerated_percentage:
            raise FailureEventException(
                FailureEvent(
                    env=env,
                    error_name=StatesErrorName(typ=StatesErrorNameType.StatesExceedToleratedFailureThreshold),
                    event_type=HistoryEventType.MapRunFailed,
                    event_details=EventDetails(  # type: ignore[typeddict-item]
                        executionFailedEventDetails=ExecutionFailedEventDetails(
                            error=StatesErrorNameType.StatesExceedToleratedFailureThreshold.to_name(),
                            cause=f"{failed} of {total} Map children failed; the Map tolerates "
                            f"{tolerated_count} or {tolerated_percentage:g}%",
                        )
                    ),
                )
            )
        size = json_size(env.stack[-1])
        ledger.gathered_bytes = max(ledger.gathered_bytes, size)
        if size >= STATE_PAYLOAD_BYTES:
            source = f"the Distributed Map gathered {len(env.stack[-1]):,} child outputs into"
            cause = ledger.breach(payload_message("Step Functions state output", STATE_PAYLOAD_BYTES, source, size))
            raise terminal(env, StatesErrorNameType.StatesStatesDataLimitExceeded, cause)

    send_task_success = sfn_models.StepFunctionsParserBackend.send_task_success

    def task_success(self: Any, task_token: Any, outcome: str) -> Any:
        size = json_size(outcome)
        if size > TASK_OUTPUT_BYTES:
            raise SfnValidation(
                ledger.breach(payload_message("SendTaskSuccess output", TASK_OUTPUT_BYTES, "the call sent", size))
            )
        return send_task_success(self, task_token, outcome)

    put_events = events_models.EventsBackend.put_events

    def events_put(self: Any, entries: list[dict[str, Any]]) -> Any:
        for entry in entries:
            size = eventbridge_entry_size(entry)
            if size > EVENTBRIDGE_ENTRY_BYTES:
                raise EventsValidation(
                    ledger.breach(
                        payload_message(
                            "EventBridge PutEvents entry size", EVENTBRIDGE_ENTRY_BYTES, "an entry had", size
                        )
                    )
                )
        return put_events(self, entries)

    class QuotaS3Error(S3ClientError):
        def __init__(self, code: str, message: str) -> None:
            super().__init__(code, ledger.breach(message))

    def part_number(part_id: int) -> None:
        if not 1 <= int(part_id) <= S3_MAX_PARTS:
            raise QuotaS3Error(
                "InvalidArgument",
                f"AWS quota: S3 multipart upload has at most {S3_MAX_PARTS:,} parts; got part number {part_id}",
            )

    upload_part = s3_models.S3Backend.upload_part
    upload_part_copy = s3_models.S3Backend.upload_part_copy

    def s3_upload_part(self: Any, bucket_name: str, multipart_id: str, part_id: int, *args: Any, **kwargs: Any) -> Any:
        part_number(part_id)
        return upload_part(self, bucket_name, multipart_id, part_id, *args, **kwargs)

    def s3_upload_part_copy(
        self: Any, bucket_name: str, multipart_id: str, part_id: int, *args: Any, **kwargs: Any
    ) -> Any:
        part_number(part_id)
        return upload_part_copy(self, bucket_name, multipart_id, part_id, *args, **kwargs)

    complete = s3_models.FakeMultipart.complete

    def s3_complete(self: Any, body: Any) -> Any:
        parts = list(body)
        for number, (part_id, _) in enumerate(parts[:-1], start=1):
            part = self.parts.get(part_id)
            if part is not None and part.contentsize < S3_MIN_PART_BYTES:
                raise QuotaS3Error(
                    "EntityTooSmall",
                    payload_message(
                        "S3 multipart minimum part size (all but the last)",
                        S3_MIN_PART_BYTES,
                        f"part {number} of {len(parts)} was",
                        part.contentsize,
                    ),
                )
        return complete(self, iter(parts))

    def dynamodb_checked(action: str) -> Callable[..., Any]:
        original = getattr(dynamodb_responses.DynamoHandler, action_method(action))

        def call(self: Any) -> Any:
            message = dynamodb_breach(action, self.body)
            if message is not None:
                raise MockValidationException(ledger.breach(message))
            return original(self)

        return call

    with ExitStack() as stack:
        patch = stack.enter_context
        for action in ("PutItem", "BatchWriteItem", "TransactWriteItems"):
            patch(mock.patch.object(dynamodb_responses.DynamoHandler, action_method(action), dynamodb_checked(action)))
        patch(mock.patch.object(error_equals_decl.ErrorEqualsDecl, "_eval_body", error_equals))
        for cls, what, verb in (
            (state_module.CommonStateField, "state output", "had"),
            (state_task_lambda.StateTaskLambda, "task result", "returned"),
            (state_task_service.StateTaskService, "task result", "returned"),
        ):
            patch(mock.patch.object(cls, "_verify_size_quota", sized(cls._verify_size_quota, what, verb)))
        patch(mock.patch.object(state_module.CommonStateField, "_eval_body", counted_state))
        patch(mock.patch.object(execute_state.ExecutionState, "_evaluate_with_timeout", counted_attempt))
        patch(mock.patch.object(distributed.DistributedIterationComponent, "_map_run", gathered))
        patch(mock.patch.object(sfn_models.StepFunctionsParserBackend, "send_task_success", task_success))
        patch(mock.patch.object(events_models.EventsBackend, "put_events", events_put))
        # moto reads its minimum part size from S3_UPLOAD_PART_MIN_SIZE, which tests may lower: use AWS's
        patch(mock.patch.object(s3_models, "S3_UPLOAD_PART_MIN_SIZE", S3_MIN_PART_BYTES))
        patch(mock.patch.object(s3_models.S3Backend, "upload_part", s3_upload_part))
        patch(mock.patch.object(s3_models.S3Backend, "upload_part_copy", s3_upload_part_copy))
        patch(mock.patch.object(s3_models.FakeMultipart, "complete", s3_complete))
        # moto allows 25 actions in a transaction, DynamoDB's old quota; AWS allows 100 today
        patch(mock.patch.object(dynamodb_responses, "TRANSACTION_MAX_ITEMS", TRANSACT_WRITE_ITEMS))
        patch(mock.patch.object(socket.socket, "__init__", _counted_socket_init))
        # SpooledTemporaryFile spills into tempfile.TemporaryFile
        patch(mock.patch.object(tempfile, "TemporaryFile", _measured_temporary_file))
        yield ledger
