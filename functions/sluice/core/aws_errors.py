"""Which AWS errors inside a step are worth running the step again.

The SDK already retries throttling and 5xx answers a few times (standard retry mode); what still
gets through means the service is busy for longer than the SDK waits. The step then fails as
`Transient`, which the state machine retries with its own, longer backoff (Step Functions matches
a Lambda error by its `errorType`, the exception's class name). Anything else (a missing object, a
denied call, a failed condition) fails the step as it is: retrying cannot fix it.
"""

from __future__ import annotations

from typing import Any

import orjson
from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

from sluice.contract import causes

# What botocore's standard mode treats as throttling (botocore/retries/standard.py), plus the
# DynamoDB, S3 and Step Functions spellings of "slow down".
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "RequestLimitExceededException",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
        "ThrottlingError",
    }
)
# Errors a service returns for its own trouble, whatever the status code.
TRANSIENT_CODES = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "InternalFailure",
        "InternalServerError",
        "InternalServerErrorException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "ServiceException",
    }
)
TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
# TransactWriteItems fails as a whole when one item is throttled or another transaction holds it.
TRANSIENT_CANCELLATION_CODES = frozenset({"ThrottlingError", "TransactionConflict", "ProvisionedThroughputExceeded"})


class Transient(Exception):
    """A step failed on a condition that passes: the state machine's Retry runs it again."""


def _client_error_is_transient(error: ClientError) -> bool:
    response = error.response
    code = response.get("Error", {}).get("Code", "")
    if code in THROTTLING_CODES or code in TRANSIENT_CODES:
        return True
    if code == "TransactionCanceledException":
        reasons = [r.get("Code") for r in response.get("CancellationReasons", []) or []]
        failed = [c for c in reasons if c and c != "None"]
        return bool(failed) and all(c in TRANSIENT_CANCELLATION_CODES for c in failed)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status in TRANSIENT_STATUSES


def is_transient(error: BaseException) -> bool:
    """Whether running the step again could succeed: throttled, a 5xx, or a lost connection.

    Follows `raise ... from` causes, so a core function that wraps an AWS error keeps its class.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, Transient):
            return True
        if isinstance(current, ClientError) and _client_error_is_transient(current):
            return True
        # EndpointConnectionError, ConnectionClosedError, ConnectTimeoutError, ReadTimeoutError
        if isinstance(current, ConnectionError | HTTPClientError):
            return True
        current = current.__cause__
    return False


def as_step_error(error: Exception) -> Exception:
    """The error the step should fail with: `Transient` for what passes, else the error itself."""
    if isinstance(error, Transient) or not is_transient(error):
        return error
    return Transient(f"{type(error).__name__}: {error}")


# what S3 answers for an object that is not there (HeadObject has no body, so only its status)
MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def is_missing(exc: Exception) -> bool:
    """Whether an S3 call failed because the object does not exist."""
    return getattr(exc, "response", {}).get("Error", {}).get("Code") in MISSING_CODES


@causes.under(causes.SHARD_OUTPUTS, causes.MERGE, causes.MARK_FAILED)
def read_json_if_any(s3: Any, bucket: str, key: str) -> Any | None:
    """The object parsed as JSON; None if it does not exist (a missing object is an answer here)."""
    try:
        raw = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if is_missing(exc):
            return None
        raise
    return orjson.loads(raw)
