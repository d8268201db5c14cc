"""Throttled or failing AWS calls inside a step fail it as `Transient`, which the state machine retries."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError
from sluice.contract.definition import TRANSIENT_LAMBDA_ERRORS, definition
from sluice.core.aws_errors import Transient, as_step_error, is_transient
from sluice_handlers.observability import instrumented

from sluice_local.cloud import LambdaContext


def client_error(code: str, status: int, operation: str = "PutItem", **extra: Any) -> ClientError:
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": f"{code} happened"},
        "ResponseMetadata": {"HTTPStatusCode": status},
        **extra,
    }
    return ClientError(response, operation)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "operation"),
    [
        (client_error("ProvisionedThroughputExceededException", 400), "PutItem"),
        (client_error("ThrottlingException", 400), "BatchWriteItem"),
        (client_error("SlowDown", 503), "PutObject"),
        (client_error("ServiceUnavailable", 503), "GetObject"),
        (client_error("InternalError", 500), "UploadPartCopy"),
        (client_error("ThrottlingException", 400), "SendTaskSuccess"),
        (client_error("TooManyRequestsException", 429), "PutEvents"),
        (client_error("RequestTimeout", 400), "UploadPart"),
        (client_error("SomethingNew", 502), "GetItem"),
    ],
)
def test_throttling_and_service_errors_are_transient(error: ClientError, operation: str) -> None:
    assert is_transient(error), operation
    step_error = as_step_error(error)
    assert type(step_error).__name__ == "Transient"
    assert error.response["Error"]["Code"] in str(step_error)


@pytest.mark.parametrize(
    "error",
    [
        EndpointConnectionError(endpoint_url="https://dynamodb.eu-west-1.amazonaws.com"),
        ConnectTimeoutError(endpoint_url="https://s3.amazonaws.com"),
        ReadTimeoutError(endpoint_url="https://states.eu-west-1.amazonaws.com"),
    ],
)
def test_lost_connections_are_transient(error: Exception) -> None:
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        client_error("ConditionalCheckFailedException", 400),
        client_error("AccessDenied", 403, "PutObject"),
        client_error("NoSuchKey", 404, "GetObject"),
        client_error("PreconditionFailed", 412, "HeadObject"),
        client_error("ValidationException", 400),
        client_error("TaskTimedOut", 400, "SendTaskSuccess"),
        ValueError("a bad option"),
        KeyError("detail"),
    ],
)
def test_errors_a_retry_cannot_fix_stay_as_they_are(error: Exception) -> None:
    assert not is_transient(error)
    assert as_step_error(error) is error


def test_a_transaction_is_transient_only_when_every_reason_is() -> None:
    def cancelled(*codes: str) -> ClientError:
        reasons = [{"Code": c} for c in codes]
        return client_error("TransactionCanceledException", 400, "TransactWriteItems", CancellationReasons=reasons)

    assert is_transient(cancelled("None", "ThrottlingError"))
    assert is_transient(cancelled("TransactionConflict", "None"))
    assert not is_transient(cancelled("ConditionalCheckFailed", "ThrottlingError"))
    assert not is_transient(cancelled("None", "None"))


def test_a_wrapped_aws_error_keeps_its_kind() -> None:
    try:
        try:
            raise client_error("SlowDown", 503, "PutObject")
        except ClientError as exc:
            raise RuntimeError("checkpoint failed") from exc
    except RuntimeError as wrapped:
        assert is_transient(wrapped)


def test_the_handler_boundary_turns_a_throttled_call_into_the_error_the_definition_retries() -> None:
    @instrumented
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise client_error("ProvisionedThroughputExceededException", 400, "UpdateItem")

    with pytest.raises(Transient) as raised:
        handler({"job_id": "j"}, LambdaContext("plan", 60))
    # Lambda reports an unhandled error's class name as errorType; Step Functions matches on it
    assert type(raised.value).__name__ in TRANSIENT_LAMBDA_ERRORS
    assert isinstance(raised.value.__cause__, ClientError)

    @instrumented
    def denied(event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise client_error("AccessDenied", 403, "PutObject")

    with pytest.raises(ClientError):
        denied({}, LambdaContext("plan", 60))


def _tasks(states: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for state in states.values():
        if state["Type"] == "Task":
            found.append(state)
        if state["Type"] == "Map":
            found.extend(_tasks(state["ItemProcessor"]["States"]))
    return found


def test_every_lambda_step_retries_transient_and_client_execution_timeouts() -> None:
    tasks = _tasks(definition()["States"])
    assert len(tasks) >= 10
    for task in tasks:
        retried = {e for rule in task["Retry"] for e in rule["ErrorEquals"]}
        assert {"Transient", "Lambda.ClientExecutionTimeoutException", "Lambda.TooManyRequestsException"} <= retried
