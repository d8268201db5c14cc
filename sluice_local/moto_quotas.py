"""What AWS refuses and moto accepts, refused inside moto with the quota named.

Part of the local cloud's changes to moto's internals (`sluice_local.moto_patches.applied` enters
`quota_checks` once it has checked the moto version); `sluice_local.quotas` holds the numbers and the
messages. One patch set per service: Step Functions' error names, payload sizes, history and
Distributed Map, its task callbacks, EventBridge's entry size, S3's multipart parts, and
DynamoDB's item and transaction sizes. moto's modules are imported when the checks are entered,
as the rest of moto's internals are, so that importing the local cloud stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

from sluice_local import quotas as q


@contextmanager
def quota_checks(ledger: q.Ledger) -> Iterator[q.Ledger]:
    """moto refuses what AWS refuses, with the quota named (`sluice_local.quotas` holds the numbers)."""
    with ExitStack() as stack:
        stack.enter_context(_dynamodb_writes(ledger))
        stack.enter_context(_uncatchable_errors())
        stack.enter_context(_state_payloads(ledger))
        stack.enter_context(_execution_history(ledger))
        stack.enter_context(_distributed_map(ledger))
        stack.enter_context(_task_callbacks(ledger))
        stack.enter_context(_eventbridge_entries(ledger))
        stack.enter_context(_s3_multipart(ledger))
        yield ledger


def _terminal(env: Any, typ: Any, cause: str, *, failed: Any = None) -> Exception:
    """The failure that ends the execution (or, as `failed`, another history event) with
    `typ`'s error name and `cause`, as the interpreter raises its own."""
    from moto.stepfunctions.parser.api import ExecutionFailedEventDetails, HistoryEventType
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails

    return FailureEventException(
        FailureEvent(
            env=env,
            error_name=StatesErrorName(typ=typ),
            event_type=failed or HistoryEventType.ExecutionFailed,
            event_details=EventDetails(  # type: ignore[typeddict-item]
                executionFailedEventDetails=ExecutionFailedEventDetails(error=typ.to_name(), cause=cause)
            ),
        )
    )


@contextmanager
def _uncatchable_errors() -> Iterator[None]:
    """States.ALL catches neither States.DataLimitExceeded nor States.Runtime
    (https://docs.aws.amazon.com/step-functions/latest/dg/concepts-error-handling.html); moto's does."""
    from moto.stepfunctions.parser.asl.component.common.error_name import error_equals_decl
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )

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

    with mock.patch.object(error_equals_decl.ErrorEqualsDecl, "_eval_body", error_equals):
        yield


@contextmanager
def _state_payloads(ledger: q.Ledger) -> Iterator[None]:
    """State input and output, task results: moto checks 256 KiB with a message that names no size."""
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEventException
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state import state as state_module
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import state_task_lambda
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service

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
            raise _terminal(env, StatesErrorNameType.StatesStatesDataLimitExceeded, cause)

        return verify

    with ExitStack() as stack:
        for cls, what, verb in (
            (state_module.CommonStateField, "state output", "had"),
            (state_task_lambda.StateTaskLambda, "task result", "returned"),
            (state_task_service.StateTaskService, "task result", "returned"),
        ):
            stack.enter_context(mock.patch.object(cls, "_verify_size_quota", sized(cls._verify_size_quota, what, verb)))
        yield


@contextmanager
def _execution_history(ledger: q.Ledger) -> Iterator[None]:
    """The history: every state visit and every Task attempt, counted against the execution (or
    Map child) it runs in, which fails States.Runtime past the history's quota."""
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state import state as state_module
    from moto.stepfunctions.parser.asl.component.state.exec import execute_state
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import state_task
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.resource import ResourceCondition
    from moto.stepfunctions.parser.asl.component.state.state_type import StateType

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
                raise _terminal(env, StatesErrorNameType.StatesRuntime, cause)
            state_eval(self, env)

    # each attempt of a Task (a retry is another) runs through here, on the state's thread
    evaluate = execute_state.ExecutionState._evaluate_with_timeout

    def counted_attempt(self: Any, env: Any) -> None:
        key = q.current_execution()
        if key is not None and isinstance(self, state_task.StateTask):
            waits = getattr(self.resource, "condition", None) == ResourceCondition.WaitForTaskToken
            ledger.events(key, q.CALLBACK_ATTEMPT_EVENTS if waits else q.TASK_ATTEMPT_EVENTS)
        evaluate(self, env)

    with (
        mock.patch.object(state_module.CommonStateField, "_eval_body", counted_state),
        mock.patch.object(execute_state.ExecutionState, "_evaluate_with_timeout", counted_attempt),
        # ... on a thread of its own (for the Task's timeout): what it calls is its child's too
        mock.patch.object(execute_state, "Thread", q.ChildThread),
    ):
        yield


@contextmanager
def _distributed_map(ledger: q.Ledger) -> Iterator[None]:
    """The Distributed Map gathers every child's output into its own result, before ResultPath;
    moto records ToleratedFailureCount/Percentage but never fails the Map on them."""
    from moto.stepfunctions.parser.api import HistoryEventType
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.iteration import (
        distributed_iteration_component as distributed,
    )

    map_run = distributed.DistributedIterationComponent._map_run

    def gathered(self: Any, env: Any, eval_input: Any) -> None:
        map_run(self, env, eval_input)
        record = eval_input.map_run_record
        failed, total = record.item_counter.failed.get(), record.item_counter.total.get()
        tolerated_count, tolerated_percentage = record.tolerated_failure_count, record.tolerated_failure_percentage
        if failed and failed > tolerated_count and 100.0 * failed / max(total, 1) > tolerated_percentage:
            raise _terminal(
                env,
                StatesErrorNameType.StatesExceedToleratedFailureThreshold,
                f"{failed} of {total} Map children failed; the Map tolerates "
                f"{tolerated_count} or {tolerated_percentage:g}%",
                failed=HistoryEventType.MapRunFailed,
            )
        size = q.json_size(env.stack[-1])
        ledger.gathered_bytes = max(ledger.gathered_bytes, size)
        if size >= q.STATE_PAYLOAD_BYTES:
            source = f"the Distributed Map gathered {len(env.stack[-1]):,} child outputs into"
            cause = ledger.breach(q.payload_message("Step Functions state output", q.STATE_PAYLOAD_BYTES, source, size))
            raise _terminal(env, StatesErrorNameType.StatesStatesDataLimitExceeded, cause)

    with mock.patch.object(distributed.DistributedIterationComponent, "_map_run", gathered):
        yield


@contextmanager
def _task_callbacks(ledger: q.Ledger) -> Iterator[None]:
    """SendTaskSuccess: its output within the callback's quota."""
    from moto.stepfunctions.exceptions import ValidationException as SfnValidation
    from moto.stepfunctions.parser import models as sfn_models

    send_task_success = sfn_models.StepFunctionsParserBackend.send_task_success

    def task_success(self: Any, task_token: Any, outcome: str) -> Any:
        size = q.json_size(outcome)
        if size > q.TASK_OUTPUT_BYTES:
            raise SfnValidation(
                ledger.breach(q.payload_message("SendTaskSuccess output", q.TASK_OUTPUT_BYTES, "the call sent", size))
            )
        return send_task_success(self, task_token, outcome)

    with mock.patch.object(sfn_models.StepFunctionsParserBackend, "send_task_success", task_success):
        yield


@contextmanager
def _eventbridge_entries(ledger: q.Ledger) -> Iterator[None]:
    """PutEvents: each entry within EventBridge's entry size."""
    from moto.events import models as events_models
    from moto.events.exceptions import ValidationException as EventsValidation

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

    with mock.patch.object(events_models.EventsBackend, "put_events", events_put):
        yield


@contextmanager
def _s3_multipart(ledger: q.Ledger) -> Iterator[None]:
    """Multipart uploads: part numbers within S3's count, every part but the last at least its minimum size."""
    from moto.s3 import models as s3_models
    from moto.s3.exceptions import S3ClientError

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

    with (
        # moto reads its minimum part size from S3_UPLOAD_PART_MIN_SIZE, which tests may lower: use AWS's
        mock.patch.object(s3_models, "S3_UPLOAD_PART_MIN_SIZE", q.S3_MIN_PART_BYTES),
        mock.patch.object(s3_models.S3Backend, "upload_part", s3_upload_part),
        mock.patch.object(s3_models.S3Backend, "upload_part_copy", s3_upload_part_copy),
        mock.patch.object(s3_models.FakeMultipart, "complete", s3_complete),
    ):
        yield


@contextmanager
def _dynamodb_writes(ledger: q.Ledger) -> Iterator[None]:
    """PutItem, BatchWriteItem and TransactWriteItems: items and requests within DynamoDB's sizes."""
    from moto.dynamodb import responses as dynamodb_responses
    from moto.dynamodb.exceptions import MockValidationException

    def checked(action: str) -> Callable[..., Any]:
        original = getattr(dynamodb_responses.DynamoHandler, q.action_method(action))

        def call(self: Any) -> Any:
            message = q.dynamodb_breach(action, self.body)
            if message is not None:
                raise MockValidationException(ledger.breach(message))
            return original(self)

        return call

    with ExitStack() as stack:
        for action in ("PutItem", "BatchWriteItem", "TransactWriteItems"):
            method = q.action_method(action)
            stack.enter_context(mock.patch.object(dynamodb_responses.DynamoHandler, method, checked(action)))
        # moto allows 25 actions in a transaction, DynamoDB's old quota; AWS allows 100 today
        stack.enter_context(mock.patch.object(dynamodb_responses, "TRANSACTION_MAX_ITEMS", q.TRANSACT_WRITE_ITEMS))
        yield
