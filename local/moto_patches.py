"""Every change the local cloud makes to moto's internals, in one place, for one moto version.

moto implements the AWS APIs in-process; the local cloud needs four kinds of change to it:
- routing: the interpreter's Lambda calls go to the handlers in this process (moto's Lambda
  would need Docker), and the Map's ItemReader reads as the state machine's role;
- consistency: DynamoDB's single-item atomicity, which moto's unlocked updates lack;
- quotas: what AWS refuses and moto accepts (`quota_checks`, numbers in `local.quotas`);
- speed: work moto repeats per request that a local run can do once (`faster`).
All of it reaches into modules moto does not promise to keep, so `applied` refuses to run on a
moto other than the one it was written for (tests/unit/test_moto_patches.py says so first).
"""

from __future__ import annotations

import copy
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

import boto3
import moto
from botocore.config import Config
from moto.core.base_backend import BackendDict
from moto.dynamodb.responses import DynamoHandler
from moto.stepfunctions.parser.asl.component.state.exec.state_map.item_reader.eval import resource_eval_s3
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

from local import dynamo_meter as meter
from local import ledger as calls
from local import quotas as q

# the moto these patches were written against and tested with (requirements.txt pins it)
WRITTEN_FOR = "5.2.5"

# what the local cloud calls, most often first
SERVICES = ("s3", "dynamodb", "stepfunctions", "secretsmanager", "events", "sts", "iam")

LambdaInvoke = Callable[[dict[str, Any], str, Any], dict[str, Any]]


class UnsupportedMoto(RuntimeError):
    pass


def check_version(installed: str | None = None) -> None:
    installed = installed or moto.__version__
    if installed != WRITTEN_FOR:
        raise UnsupportedMoto(
            f"the local cloud patches moto's internals as of moto {WRITTEN_FOR}, and moto {installed} is "
            f"installed; install the pinned version (pip install -r requirements.txt) or port local/moto_patches.py"
        )


@contextmanager
def applied(
    *,
    invoke: LambdaInvoke,
    workflow: boto3.Session,
    ledger: q.Ledger,
    recorded: calls.CallLedger,
    tables: meter.Tables,
) -> Iterator[None]:
    """All of the patches, while the local cloud runs (inside `mock_aws`)."""
    check_version()
    with ExitStack() as stack:
        stack.enter_context(routed(invoke, workflow))
        stack.enter_context(consistent())
        stack.enter_context(quota_checks(ledger))
        stack.enter_context(metered(recorded, tables))
        stack.enter_context(faster())
        yield


@contextmanager
def routed(invoke: LambdaInvoke, workflow: boto3.Session) -> Iterator[None]:
    # moto's Map reads its ItemReader with fixed keys moto does not know; the state machine
    # reads with its own role
    def item_reader_client(region: str, service: str, state_credentials: Any = None) -> Any:
        return workflow.client(service, region_name=region, config=Config(retries={"total_max_attempts": 1}))

    with (
        mock.patch.object(lambda_eval_utils, "_invoke_lambda_function", invoke),
        mock.patch.object(resource_eval_s3, "boto_client_for", item_reader_client),
    ):
        yield


_create_account_specific_backend = BackendDict._create_account_specific_backend


def _known_backend_fast_path(self: BackendDict, account_id: str) -> None:  # type: ignore[type-arg]
    """moto checks `self not in BackendDict._instances` on every request, which compares whole
    backends by value; with tens of thousands of rows that check dominated a local job's CPU.
    An identity check answers the same question for a backend that already exists."""
    known = BackendDict._instances  # type: ignore[misc]
    if account_id in self.keys() and any(instance is self for instance in known):
        return
    _create_account_specific_backend(self, account_id)


_dynamodb_call_action = DynamoHandler.call_action
_dynamodb_calls = threading.RLock()


def _atomic_dynamodb_call(self: DynamoHandler) -> Any:
    """DynamoDB applies each single-item write atomically; moto computes an update's new
    values and writes them back with no lock. Two webhooks settling a shard's last two items
    on two receiver threads could both read `waiting` 2 and both write 1, and the shard
    slept until its poll timeout. One DynamoDB call at a time gives back the service's
    guarantee; the GIL already ran them one at a time for most of their length."""
    with _dynamodb_calls:
        return _dynamodb_call_action(self)


@contextmanager
def consistent() -> Iterator[None]:
    with (
        mock.patch.object(BackendDict, "_create_account_specific_backend", _known_backend_fast_path),
        mock.patch.object(DynamoHandler, "call_action", _atomic_dynamodb_call),
    ):
        yield


@contextmanager
def metered(ledger: calls.CallLedger, tables: meter.Tables) -> Iterator[None]:
    """Every request moto answers, in the ledger with what AWS counts for it; a DynamoDB request
    under the lock that makes it atomic, so the item sizes before and after it are its own."""
    from moto.core.botocore_stubber import BotocoreStubber

    answer = BotocoreStubber.__call__

    def timed(*args: Any, **kwargs: Any) -> tuple[Any, tuple[float, float]]:
        started, cpu = time.perf_counter(), time.thread_time()
        response = answer(*args, **kwargs)
        return response, (time.perf_counter() - started, time.thread_time() - cpu)

    def stubbed(self: Any, event_name: str, request: Any, **kwargs: Any) -> Any:
        if not self.enabled:
            return answer(self, event_name, request, **kwargs)
        _, service, operation = event_name.split(".", 2)
        caller, at = ledger.caller(calls.header(request, "Authorization")), ledger.now()
        if service != "dynamodb":
            response, spent = timed(self, event_name, request, **kwargs)
            ledger.answered(service, operation, caller, at, spent, request, response)
            return response
        with _dynamodb_calls:
            pending = meter.DynamoRequest(operation, json.loads(request.body or b"{}"), tables)
            response, spent = timed(self, event_name, request, **kwargs)
            ledger.add(pending.records(caller, at, spent, response))
        return response

    with mock.patch.object(BotocoreStubber, "__call__", stubbed), calls.attributed():
        yield


@contextmanager
def quota_checks(ledger: q.Ledger) -> Iterator[q.Ledger]:
    """moto refuses what AWS refuses, with the quota named (`local.quotas` holds the numbers)."""
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
            size = q.json_size(value)
            if size < q.STATE_PAYLOAD_BYTES:
                return
            name = getattr(self, "name", None) or getattr(getattr(self, "resource", None), "resource_arn", "?")
            cause = ledger.breach(
                q.payload_message(f"Step Functions {what}", q.STATE_PAYLOAD_BYTES, f"{name} {verb}", size)
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

    def execution_of(env: Any) -> tuple[str, int | None]:
        context = env.states.context_object.context_object_data
        item = context.get("Map", {}).get("Item", {})
        return str(context.get("Execution", {}).get("Id", "")), item.get("Index")

    def counted_state(self: Any, env: Any) -> None:
        key = execution_of(env)
        with q.evaluating(key):
            extra = q.MAP_RUN_EVENTS if self.state_type == StateType.Map else 0
            total = ledger.events(key, q.STATE_EVENTS + extra)
            if total > q.HISTORY_EVENTS:
                cause = ledger.breach(q.history_message(key, total, self.name))
                raise terminal(env, StatesErrorNameType.StatesRuntime, cause)
            state_eval(self, env)

    # each attempt of a Task (a retry is another) runs through here, on the state's thread
    evaluate = execute_state.ExecutionState._evaluate_with_timeout

    def counted_attempt(self: Any, env: Any) -> None:
        key = q.current_execution()
        if key is not None and isinstance(self, state_task.StateTask):
            waits = getattr(self.resource, "condition", None) == ResourceCondition.WaitForTaskToken
            ledger.events(key, q.CALLBACK_ATTEMPT_EVENTS if waits else q.TASK_ATTEMPT_EVENTS)
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
        size = q.json_size(env.stack[-1])
        ledger.gathered_bytes = max(ledger.gathered_bytes, size)
        if size >= q.STATE_PAYLOAD_BYTES:
            source = f"the Distributed Map gathered {len(env.stack[-1]):,} child outputs into"
            cause = ledger.breach(q.payload_message("Step Functions state output", q.STATE_PAYLOAD_BYTES, source, size))
            raise terminal(env, StatesErrorNameType.StatesStatesDataLimitExceeded, cause)

    send_task_success = sfn_models.StepFunctionsParserBackend.send_task_success

    def task_success(self: Any, task_token: Any, outcome: str) -> Any:
        size = q.json_size(outcome)
        if size > q.TASK_OUTPUT_BYTES:
            raise SfnValidation(
                ledger.breach(q.payload_message("SendTaskSuccess output", q.TASK_OUTPUT_BYTES, "the call sent", size))
            )
        return send_task_success(self, task_token, outcome)

    put_events = events_models.EventsBackend.put_events

    def events_put(self: Any, entries: list[dict[str, Any]]) -> Any:
        for entry in entries:
            size = q.eventbridge_entry_size(entry)
            if size > q.EVENTBRIDGE_ENTRY_BYTES:
                raise EventsValidation(
                    ledger.breach(
                        q.payload_message(
                            "EventBridge PutEvents entry size", q.EVENTBRIDGE_ENTRY_BYTES, "an entry had", size
                        )
                    )
                )
        return put_events(self, entries)

    class QuotaS3Error(S3ClientError):
        def __init__(self, code: str, message: str) -> None:
            super().__init__(code, ledger.breach(message))

    def part_number(part_id: int) -> None:
        if not 1 <= int(part_id) <= q.S3_MAX_PARTS:
            raise QuotaS3Error(
                "InvalidArgument",
                f"AWS quota: S3 multipart upload has at most {q.S3_MAX_PARTS:,} parts; got part number {part_id}",
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
            if part is not None and part.contentsize < q.S3_MIN_PART_BYTES:
                raise QuotaS3Error(
                    "EntityTooSmall",
                    q.payload_message(
                        "S3 multipart minimum part size (all but the last)",
                        q.S3_MIN_PART_BYTES,
                        f"part {number} of {len(parts)} was",
                        part.contentsize,
                    ),
                )
        return complete(self, iter(parts))

    def dynamodb_checked(action: str) -> Callable[..., Any]:
        original = getattr(dynamodb_responses.DynamoHandler, q.action_method(action))

        def call(self: Any) -> Any:
            message = q.dynamodb_breach(action, self.body)
            if message is not None:
                raise MockValidationException(ledger.breach(message))
            return original(self)

        return call

    with ExitStack() as stack:
        patch = stack.enter_context
        for action in ("PutItem", "BatchWriteItem", "TransactWriteItems"):
            method = q.action_method(action)
            patch(mock.patch.object(dynamodb_responses.DynamoHandler, method, dynamodb_checked(action)))
        patch(mock.patch.object(error_equals_decl.ErrorEqualsDecl, "_eval_body", error_equals))
        for cls, what, verb in (
            (state_module.CommonStateField, "state output", "had"),
            (state_task_lambda.StateTaskLambda, "task result", "returned"),
            (state_task_service.StateTaskService, "task result", "returned"),
        ):
            patch(mock.patch.object(cls, "_verify_size_quota", sized(cls._verify_size_quota, what, verb)))
        patch(mock.patch.object(state_module.CommonStateField, "_eval_body", counted_state))
        patch(mock.patch.object(execute_state.ExecutionState, "_evaluate_with_timeout", counted_attempt))
        # ... on a thread of its own (for the Task's timeout): what it calls is its child's too
        patch(mock.patch.object(execute_state, "Thread", q.ChildThread))
        patch(mock.patch.object(distributed.DistributedIterationComponent, "_map_run", gathered))
        patch(mock.patch.object(sfn_models.StepFunctionsParserBackend, "send_task_success", task_success))
        patch(mock.patch.object(events_models.EventsBackend, "put_events", events_put))
        # moto reads its minimum part size from S3_UPLOAD_PART_MIN_SIZE, which tests may lower: use AWS's
        patch(mock.patch.object(s3_models, "S3_UPLOAD_PART_MIN_SIZE", q.S3_MIN_PART_BYTES))
        patch(mock.patch.object(s3_models.S3Backend, "upload_part", s3_upload_part))
        patch(mock.patch.object(s3_models.S3Backend, "upload_part_copy", s3_upload_part_copy))
        patch(mock.patch.object(s3_models.FakeMultipart, "complete", s3_complete))
        # moto allows 25 actions in a transaction, DynamoDB's old quota; AWS allows 100 today
        patch(mock.patch.object(dynamodb_responses, "TRANSACTION_MAX_ITEMS", q.TRANSACT_WRITE_ITEMS))
        yield ledger


def _eval_pool(self: Any, job: Any, worker_frame: Any) -> None:
    """moto's DistributedItemProcessorWorker._eval_pool, as a loop: moto recurses once per
    child, so a worker that runs 1,000 children hits Python's recursion limit."""
    while True:
        if job is None:
            self._env.delete_frame(worker_frame)
            return
        job_frame = worker_frame.open_inner_frame()
        self._eval_job(env=job_frame, job=job)
        worker_frame.delete_frame(job_frame)
        if isinstance(job.job_output, Exception) or self.stopped():
            self._env.delete_frame(worker_frame)
            self._job_pool.close_job(job)
            return
        next_job = self._job_pool.next_job()
        if next_job is None:
            self._env.delete_frame(worker_frame)
            self._job_pool.close_job(job)
            return
        self._job_pool.close_job(job)
        job = next_job


def _prefix_listing(list_objects: Any) -> Any:
    """S3Backend.list_objects walks every key of the bucket through the versioned store for
    each listing; a job of 1,200 shards holds ~10,000 keys and lists ~2,400 times. Filter the
    names first (a C-level scan), and let moto list only those."""

    def listed(self: Any, bucket: Any, prefix: str | None, *args: Any, **kwargs: Any) -> Any:
        store = getattr(bucket, "keys", None)
        if not prefix or not isinstance(store, dict):
            return list_objects(self, bucket, prefix, *args, **kwargs)
        subset = type(store)()
        # list() copies the names in one step under the GIL; other threads add keys meanwhile
        for name in [n for n in list(dict.keys(store)) if n.startswith(prefix)]:
            dict.__setitem__(subset, name, dict.__getitem__(store, name))
        view = copy.copy(bucket)
        view.keys = subset
        return list_objects(self, view, prefix, *args, **kwargs)

    return listed


@contextmanager
def faster() -> Iterator[None]:
    """Work moto repeats on every request or state, done once per local cloud instead.

    A job of 1,200 shards makes about 20,000 AWS calls and 10,000 state transitions in one
    process; profiled, most of its time went to what moto recomputes from inputs that never
    change while the local cloud runs: the answers are the same, only cached."""
    from moto import backend_index
    from moto.core.base_backend import BaseBackend
    from moto.s3 import models as s3_models
    from moto.s3 import urls as s3_urls
    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration.itemprocessor import (
        distributed_item_processor_worker as worker,
    )
    from moto.stepfunctions.parser.asl.utils import json_path

    # S3's backend re-imports (importlib.reload) moto.s3.urls twice per request, in case the
    # environment changed which URLs it serves; it does not change during a run
    def s3_url_module(self: Any) -> Any:
        return s3_urls

    # every request rebuilds each candidate backend's whole URL table
    urls = BaseBackend.urls
    by_class: dict[type, Any] = {}

    def cached_urls(self: Any) -> Any:
        table = by_class.get(type(self))
        if table is None:
            table = by_class[type(self)] = urls.fget(self)  # type: ignore[attr-defined]
        return table

    # every request tries each service's URL pattern in turn, S3's after 200 others; the first
    # match wins, and none before ours matches our URLs, so trying ours first routes the same
    patterns = backend_index.backend_url_patterns
    ours = [p for p in patterns if p[0] in SERVICES]
    ours.sort(key=lambda p: SERVICES.index(p[0]))
    reordered = ours + [p for p in patterns if p[0] not in SERVICES]

    # the interpreter parses each JSONPath afresh, and jsonpath_ng builds a yacc parser per parse
    with ExitStack() as stack:
        patch = stack.enter_context
        patch(mock.patch.object(s3_models.S3Backend, "_url_module", property(s3_url_module)))
        patch(mock.patch.object(BaseBackend, "urls", property(cached_urls)))
        patch(mock.patch.object(json_path, "parse", functools.lru_cache(maxsize=1024)(json_path.parse)))
        patch(mock.patch.object(result_path, "parse", functools.lru_cache(maxsize=1024)(result_path.parse)))
        patch(mock.patch.object(backend_index, "backend_url_patterns", reordered))
        listing = _prefix_listing(s3_models.S3Backend.list_objects)
        patch(mock.patch.object(s3_models.S3Backend, "list_objects", listing))
        patch(mock.patch.object(worker.DistributedItemProcessorWorker, "_eval_pool", _eval_pool))
        yield
