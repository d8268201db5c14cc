"""The local cloud's ledger of AWS calls: every request a job makes, and what AWS counts for it.

The local cloud sees every call a step makes (moto answers them in this process), so it writes
each one down: the service and operation, the calling step and, where known, the shard (the
Map child it runs for), the seconds it took, and what AWS would count. For DynamoDB that is one
record per item touched, with its partition and sort key, its size as DynamoDB computes it
(`sluice_local.quotas.item_size`) and the capacity units the request consumes, by the rules of
https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/read-write-operations.html:
writes per 1 KB of the larger of the item before and after, reads per 4 KB and half that when
eventually consistent, twice either in a transaction, a batch item by item, a Query by the bytes
it read before any filter, and a failed conditional write still charged for the item it checked.
A write to an item that a global secondary index projects also writes the index. For S3 it is
the bucket, key, bytes and whether the request counts against a prefix's PUT or GET rate; for
every other service, the call itself. Lambda invocations are recorded with their duration and,
when measured, their memory.

`bench/capacity.py` reads it to derive per-line, per-shard and per-job figures from measured
runs; nothing in the ledger knows Sluice's key layout.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import os
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock
from urllib.parse import parse_qs, unquote, urlsplit

from sluice.contract import causes

# https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html: per
# partitioned prefix, 3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests a second
S3_WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})

# the local cloud's own calls (uploads, starting and watching executions), not a step's
CLOUD = "cloud"
LOST_CONDITIONS = frozenset({"ConditionalCheckFailedException", "TransactionCanceledException"})


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a call: a step (a function's step name, `webhook`, `workflow` or `cloud`), and
    for a step run as a Map child, the execution and the child's index (its shard)."""

    step: str
    shard: int | None = None
    execution: str | None = None


_caller: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("sluice_local_caller", default=None)


@contextmanager
def calling(caller: Caller) -> Iterator[None]:
    """Attribute every call made meanwhile, on this thread and the work it hands on, to `caller`."""
    token = _caller.set(caller)
    try:
        yield
    finally:
        _caller.reset(token)


def current_caller() -> Caller | None:
    return _caller.get()


@dataclass(frozen=True, slots=True)
class Call:
    """One AWS request, or for DynamoDB one item (or one Query's partition) of a request."""

    at: float
    service: str
    operation: str
    step: str
    shard: int | None
    execution: str | None
    seconds: float = 0.0
    error: str = ""
    # the calling thread's CPU seconds in the call (moto answers on it): what was not the step's own
    cpu: float = 0.0
    # a DynamoDB request's second and later items: the request is counted on its first
    more: bool = False
    # DynamoDB
    table: str = ""
    index: str = ""
    pk: str = ""
    sk: str = ""
    read_units: float = 0.0
    write_units: float = 0.0
    item_bytes: int = 0
    # S3: the key (a listing's prefix), the bytes sent or received, and which rate it counts against
    bucket: str = ""
    key: str = ""
    nbytes: int = 0
    s3_write: bool = False
    # what triggered it (`sluice.contract.causes`); "" when the code declared none
    cause: str = ""
    # which occurrence of it (0: none), so that an occurrence that turns out another cause takes its calls along
    occurrence: int = 0


@dataclass(frozen=True, slots=True)
class Occurred:
    """`count` occurrences of a cause (`sluice.contract.causes`) in a step, with the period the code gave."""

    at: float
    cause: str
    count: int
    period_s: float | None
    every: int | None
    step: str
    shard: int | None
    execution: str | None


@dataclass(frozen=True, slots=True)
class Invocation:
    """One Lambda invocation: its step, shard, duration and, when it ran alone and was traced, memory."""

    at: float
    step: str
    shard: int | None
    execution: str | None
    seconds: float
    memory_bytes: int | None = None
    error: str = ""
    # the CPU seconds of the thread that ran the handler (its calls' included)
    cpu: float = 0.0


@dataclass(frozen=True, slots=True)
class LineEnded:
    """A line's fate known in a shard (from the shards' progress reports, which cost no request)."""

    at: float
    shard: int | None
    execution: str | None


def _cause() -> tuple[str, int]:
    found = causes.current()
    return (found.cause.name, found.serial) if found is not None else ("", 0)


# ---- reading a request and its answer


def header(request: Any, name: str) -> str:
    value = request.headers.get(name, "")
    return value.decode() if isinstance(value, bytes) else str(value or "")


def error_code(response: Any) -> str:
    """The AWS error code of a JSON protocol's answer (DynamoDB, Step Functions, ...); "" when it succeeded."""
    if response is None or response.status_code < 400:
        return ""
    try:
        answer = json.loads(response.content or b"{}")
    except ValueError:
        return str(response.status_code)
    found = answer.get("__type") or answer.get("code") if isinstance(answer, dict) else None
    return str(found or response.status_code).rsplit("#", 1)[-1]


def s3_target(url: str, method: str) -> tuple[str, str]:
    """(bucket, key) of a request, virtual-hosted or path style; a listing's key is its prefix."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    path = unquote(parts.path).lstrip("/")
    if ".s3." in host or host.endswith(".s3.amazonaws.com"):
        bucket, key = host.split(".s3", 1)[0], path
    else:
        bucket, _, key = path.partition("/")
    if method == "GET" and not key:
        query = parse_qs(parts.query)
        key = query.get("prefix", [""])[0]
    return bucket, key


# Bedrock's runtime API, by the last part of its path (`/model/{id}/converse`)
BEDROCK_RUNTIME = "bedrock-runtime"
RUNTIME_OPERATIONS = {
    "converse": "Converse",
    "converse-stream": "ConverseStream",
    "invoke": "InvokeModel",
    "invoke-with-response-stream": "InvokeModelWithResponseStream",
}


def runtime_operation(url: str) -> str:
    last = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    return RUNTIME_OPERATIONS.get(last, last)


# ---- the ledger


@dataclass
class CallLedger:
    """Every AWS call, Lambda invocation and finished line of the local cloud's runs, in order."""

    calls: list[Call] = field(default_factory=list)
    invocations: list[Invocation] = field(default_factory=list)
    lines: list[LineEnded] = field(default_factory=list)
    occurrences: list[Occurred] = field(default_factory=list)
    # access key id -> the step whose role it belongs to, for calls made outside an invocation
    identities: dict[str, str] = field(default_factory=dict)
    # trace each invocation's memory with tracemalloc when it runs alone (slow: benches only)
    trace_memory: bool = False
    # False: keep no call, occurrence or line (`sluice run`, whose memory must not grow with its
    # input; nothing there reads them), only the invocations, a few a shard
    record: bool = True
    started: float = field(default_factory=time.monotonic)
    # an occurrence's place in `occurrences`, and its calls' in `calls`, by its serial
    _occurred: dict[int, int] = field(default_factory=dict)
    _calls_of: dict[int, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return time.monotonic() - self.started

    def caller(self, authorization: str = "") -> Caller:
        found = current_caller()
        if found is not None:
            return found
        key = authorization.partition("Credential=")[2].partition("/")[0]
        return Caller(self.identities.get(key, CLOUD))

    def add(self, records: list[Call]) -> None:
        cause, serial = _cause()
        # a conditional write that found the item changed is billed, and is a race lost whatever
        # declared it: the work it was for is another writer's or done
        for r in records:
            self._append(
                dataclasses.replace(r, cause=causes.RACE.name if r.error in LOST_CONDITIONS else cause), serial
            )

    def _append(self, call: Call, serial: int) -> None:
        if not self.record:
            return
        with self._lock:
            if serial:
                self._calls_of.setdefault(serial, []).append(len(self.calls))
            self.calls.append(dataclasses.replace(call, occurrence=serial))

    def occurred(self, occurrence: causes.Occurrence) -> None:
        if not self.record:
            return
        caller = self.caller()
        name = occurrence.cause.name
        with self._lock:
            at = self._occurred.get(occurrence.serial)
            if at is not None:
                # the same occurrence, which turned out to be another cause: it and its calls so far are that
                self.occurrences[at] = dataclasses.replace(
                    self.occurrences[at], cause=name, period_s=occurrence.period_s, every=occurrence.every
                )
                for i in self._calls_of.get(occurrence.serial, []):
                    self.calls[i] = dataclasses.replace(self.calls[i], cause=name)
                return
            self._occurred[occurrence.serial] = len(self.occurrences)
            self.occurrences.append(
                Occurred(
                    self.now(),
                    name,
                    occurrence.count,
                    occurrence.period_s,
                    occurrence.every,
                    caller.step,
                    caller.shard,
                    caller.execution,
                )
            )

    def answered(
        self,
        service: str,
        operation: str,
        caller: Caller,
        at: float,
        seconds: tuple[float, float],
        request: Any,
        response: Any,
    ) -> None:
        """A request to any service but DynamoDB (`sluice_local.dynamo_meter` reads those), once answered;
        `seconds`: its wall and CPU seconds."""
        status = response.status_code if response is not None else 0
        wall, cpu = seconds
        cause, serial = _cause()
        if service != "s3":
            self._append(
                Call(
                    at,
                    service,
                    operation,
                    caller.step,
                    caller.shard,
                    caller.execution,
                    wall,
                    error_code(response),
                    cpu,
                    cause=cause,
                ),
                serial,
            )
            return
        bucket, key = s3_target(request.url, request.method)
        write = request.method in S3_WRITE_METHODS
        if self.trace_memory and request.method == "GET" and response is not None:
            response.raw = _Streamed(response.raw)
        if write:
            size = header(request, "Content-Length")
            body = request.body
            nbytes = int(size) if size.isdigit() else len(body) if isinstance(body, (bytes, bytearray)) else 0
        else:
            size = str(response.headers.get("content-length", "")) if response is not None else ""
            nbytes = int(size) if request.method == "GET" and size.isdigit() else 0
        error = str(status) if status >= 400 else ""
        self._append(
            Call(
                at,
                service,
                operation,
                caller.step,
                caller.shard,
                caller.execution,
                wall,
                error,
                cpu,
                bucket=bucket,
                key=key,
                nbytes=nbytes,
                s3_write=write,
                cause=cause,
            ),
            serial,
        )

    def requested(self, service: str, operation: str) -> None:
        """A request the local cloud answers outside moto (a signed Bedrock runtime request, a
        Bedrock batch job's call), made by the current caller under the current cause."""
        caller = self.caller()
        cause, serial = _cause()
        call = Call(self.now(), service, operation, caller.step, caller.shard, caller.execution, cause=cause)
        self._append(call, serial)

    def signing(self, sign: Callable[..., dict[str, str]]) -> Callable[..., dict[str, str]]:
        """`sign` (a step's Bedrock signer), writing down each request it signs: a runtime request
        goes over HTTP, not through boto3, and each attempt is signed anew."""

        def signed(method: str, url: str, headers: Any, body: bytes | None) -> dict[str, str]:
            self.requested(BEDROCK_RUNTIME, runtime_operation(url))
            return sign(method, url, headers, body)

        return signed

    def invoked(
        self, caller: Caller, at: float, seconds: float, memory_bytes: int | None, error: str, cpu: float = 0.0
    ) -> None:
        self.invocations.append(
            Invocation(at, caller.step, caller.shard, caller.execution, seconds, memory_bytes, error, cpu)
        )

    def line_ended(self) -> None:
        if not self.record:
            return
        caller = current_caller()
        self.lines.append(LineEnded(self.now(), caller.shard if caller else None, caller.execution if caller else None))

    def progress(self, inner: Any) -> _CountingSink:
        return _CountingSink(self, inner)


class _CountingSink:
    """The shards' progress sink: counts each line's end for the ledger, then hands it on."""

    def __init__(self, ledger: CallLedger, inner: Any) -> None:
        self._ledger = ledger
        self._inner = inner

    def outcome(self, outcome: Any, *, batch: bool, waited: bool) -> None:
        self._ledger.line_ended()
        if self._inner is not None:
            self._inner.outcome(outcome, batch=batch, waited=waited)

    def invalid(self, code: str) -> None:
        self._ledger.line_ended()
        if self._inner is not None:
            self._inner.invalid(code)

    def waiting(self, count: int) -> None:
        if self._inner is not None:
            self._inner.waiting(count)

    def cached(self, count: int) -> None:
        if self._inner is not None:
            self._inner.cached(count)


class MemoryTrace:
    """The most an invocation's Python objects held at once, as tracemalloc sees them, sampled
    every `every_s`. Allocations made in moto's own code are not counted: they are S3's and
    DynamoDB's side of a call (the objects they store, the copies they answer with), which on AWS
    live in the services, not in the function's memory."""

    def __init__(self, every_s: float = 0.1) -> None:
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-trace", daemon=True)
        self.peak = 0

    def start(self) -> None:
        # deep enough to see moto under the standard library calls it makes (a file's read, a copy)
        tracemalloc.start(_TRACE_FRAMES)
        self._thread.start()

    def sample(self) -> None:
        snapshot = tracemalloc.take_snapshot()
        held = sum(
            s.size for s in snapshot.statistics("traceback") if not any(_MOTO in f.filename for f in s.traceback)
        )
        self.peak = max(self.peak, held)

    def _run(self) -> None:
        wait = self._every_s
        while not self._stop.wait(wait):
            began = time.monotonic()
            self.sample()
            # a snapshot of a large heap takes a while: leave the invocation most of the time
            wait = max(self._every_s, 3 * (time.monotonic() - began))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.sample()
        tracemalloc.stop()
        return self.peak


class _Streamed:
    """A GET's body as the function reads it from S3: each read a copy of its own (moto hands over
    the object it stores, which a read of it all would return uncopied, and so uncounted)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def read(self, amt: int | None = None, *args: Any, **kwargs: Any) -> bytes:
        return bytes(memoryview(self._raw.read(amt, *args, **kwargs)))

    def stream(self, amt: int = 2**16, **kwargs: Any) -> Iterator[bytes]:
        while chunk := self.read(amt):
            yield chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


_MOTO = f"{os.sep}moto{os.sep}"
_TRACE_FRAMES = 8
_submit = ThreadPoolExecutor.submit


def _submit_in_context(self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    context = contextvars.copy_context()
    return _submit(self, context.run, fn, *args, **kwargs)


@contextmanager
def attributed() -> Iterator[None]:
    """Work a step hands to a thread pool stays its own: in Lambda every thread of the process
    belongs to the one invocation, so a checkpoint written on a pool's thread is its shard's.
    asyncio.to_thread carries the context already; executors' `submit` does not."""
    with mock.patch.object(ThreadPoolExecutor, "submit", _submit_in_context):
        yield
