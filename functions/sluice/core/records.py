"""Output lines in the OpenAI Batch output format."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from sluice.contract.model import ErrorCode, Outcome


def record_id(job_id: str, line: int) -> str:
    # Stable across retries and resumes, so a re-run shard writes byte-identical lines.
    return "batch_req_" + hashlib.blake2b(f"{job_id}:{line}".encode(), digest_size=12).hexdigest()


def result_record(job_id: str, outcome: Outcome) -> bytes:
    return orjson.dumps(
        {
            "id": record_id(job_id, outcome.line),
            "custom_id": outcome.custom_id,
            "response": {
                "status_code": outcome.status_code,
                "request_id": outcome.request_id,
                "body": outcome.body,
            },
            "error": None,
        }
    )


def error_record(
    job_id: str,
    line: int,
    custom_id: str | None,
    code: str,
    message: str,
    *,
    status_code: int | None = None,
    request_id: str | None = None,
    body: Any = None,
    check: str | None = None,
) -> bytes:
    response = None
    if status_code is not None:
        response = {"status_code": status_code, "request_id": request_id, "body": body}
    error = {"code": code, "message": message}
    if check is not None:
        # an `invalid_output` line: the output check its last answer failed
        error["check"] = check
    return orjson.dumps(
        {
            "id": record_id(job_id, line),
            "custom_id": custom_id,
            "response": response,
            "error": error,
            "line": line,
        }
    )


def outcome_record(job_id: str, outcome: Outcome) -> bytes:
    if outcome.ok:
        return result_record(job_id, outcome)
    return error_record(
        job_id,
        outcome.line,
        outcome.custom_id,
        outcome.error_code or "unknown",
        outcome.error_message or "",
        status_code=outcome.status_code,
        request_id=outcome.request_id,
        body=outcome.body,
        check=outcome.failed_checks[-1]
        if outcome.error_code == ErrorCode.INVALID_OUTPUT and outcome.failed_checks
        else None,
    )
