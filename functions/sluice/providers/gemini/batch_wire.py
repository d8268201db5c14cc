"""Gemini's Batch API shapes as the batch runners read them: a request's row (`{"key", "request"}`,
as the JSONL input file holds it, and as an inline request with its key in `metadata`), the batch
(a long-running `Operation` whose `metadata` is the `GenerateContentBatch`) as a `BatchStatus`, and
an answer (an inlined response, or a line of the responses file) as a `BatchRow`.

A row's key is its input line and a letter for the shape the line was written in (a chat line is
answered as a chat.completion, a Responses line as a response); the batch's `displayName` carries
its tag (`sluice/<job>/<shard>/<part>/<attempt>`), so that `find` and `listed` know Sluice's batches.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final

from sluice.contract.model import ErrorCode, Request

from ..batch import BatchCounts, BatchProblem, BatchRow, BatchState, BatchStatus, BatchTag
from . import translate

CHAT_KIND: Final = "c"
RESPONSES_KIND: Final = "r"
_KINDS = {CHAT_KIND: translate.CHAT, RESPONSES_KIND: translate.RESPONSES}
_KEY = re.compile(r"^(\d+)([cr])$")
_TAG = re.compile(r"^sluice/([A-Za-z0-9_-]+)/(\d+)/(\d+)/(\d+)$")
ROW_START: Final = b'{"key":"'
_REQUEST_MEMBER: Final = b'","request":'
# Gemini's batch states (and the SDK's job states, spelled alike), in OpenAI's words
STATES = {
    "BATCH_STATE_PENDING": BatchState.VALIDATING,
    "BATCH_STATE_RUNNING": BatchState.IN_PROGRESS,
    "BATCH_STATE_SUCCEEDED": BatchState.COMPLETED,
    "BATCH_STATE_FAILED": BatchState.FAILED,
    "BATCH_STATE_CANCELLED": BatchState.CANCELLED,
    "BATCH_STATE_EXPIRED": BatchState.EXPIRED,
    "JOB_STATE_PENDING": BatchState.VALIDATING,
    "JOB_STATE_QUEUED": BatchState.VALIDATING,
    "JOB_STATE_RUNNING": BatchState.IN_PROGRESS,
    "JOB_STATE_SUCCEEDED": BatchState.COMPLETED,
    "JOB_STATE_FAILED": BatchState.FAILED,
    "JOB_STATE_CANCELLING": BatchState.CANCELLING,
    "JOB_STATE_CANCELLED": BatchState.CANCELLED,
    "JOB_STATE_EXPIRED": BatchState.EXPIRED,
}
# Google's error statuses as the HTTP status a direct call would have had
ERROR_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "RESOURCE_EXHAUSTED": 429,
    "INTERNAL": 500,
    "UNKNOWN": 500,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}
# google.rpc.Code's numbers, as a Status in a batch's output gives them
_CODE_STATUS = {3: 400, 6: 409, 10: 409, 5: 404, 7: 403, 8: 429, 9: 400, 13: 500, 14: 503, 16: 401, 4: 504, 1: 499}
_EXCERPT = 300


def kind_of(path: str) -> str:
    return RESPONSES_KIND if path == translate.RESPONSES else CHAT_KIND


def encode_row(request: Request) -> bytes:
    """The request as a line of a batch's JSONL input: its key and the generateContent request, the
    body without its model (the batch names it once)."""
    body = request.body or b"{}"
    _, sent = translate.route(request.path, body)
    key = f"{request.line}{kind_of(request.path)}".encode()
    return ROW_START + key + _REQUEST_MEMBER + (sent or b"{}") + b"}\n"


def inline_item(row: bytes) -> bytes:
    """A row of the input file as an inline request: `{"request", "metadata": {"key"}}`."""
    row = row.rstrip(b"\n")
    key, _, request = row.removeprefix(ROW_START).partition(_REQUEST_MEMBER)
    return b'{"metadata":{"key":"' + key + b'"},"request":' + request


def display_name(tag: BatchTag) -> str:
    return f"sluice/{tag.job}/{tag.shard}/{tag.part}/{tag.attempt}"


def tag_of(name: Any) -> BatchTag | None:
    found = _TAG.match(name) if isinstance(name, str) else None
    if found is None:
        return None
    job, shard, part, attempt = found.groups()
    return BatchTag(job, int(shard), int(part), int(attempt))


def epoch(text: Any) -> float | None:
    """An RFC 3339 time (nanoseconds allowed) as epoch seconds; None for anything else."""
    if not isinstance(text, str):
        return None
    raw = text.strip().replace("Z", "+00:00")
    # Python reads at most microseconds
    raw = re.sub(r"(\.\d{6})\d+", r"\1", raw)
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return at.timestamp() if at.tzinfo is not None else None


def _number(stats: Any, name: str) -> int:
    value = stats.get(name) if isinstance(stats, dict) else None
    # int64 counts are strings in JSON
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value if isinstance(value, int) and value >= 0 else 0


def batch_of(found: Any) -> dict[str, Any]:
    """The `GenerateContentBatch` of an Operation (its `metadata`, its `response` once done), or of
    a batch given bare."""
    if not isinstance(found, dict):
        return {}
    metadata = found.get("metadata")
    if isinstance(metadata, dict) and ("state" in metadata or "displayName" in metadata):
        batch = dict(metadata)
        response = found.get("response")
        if isinstance(response, dict) and "output" not in batch:
            output = response.get("output", response)
            if isinstance(output, dict) and ("inlinedResponses" in output or "responsesFile" in output):
                batch["output"] = output
        batch.setdefault("name", found.get("name"))
        if isinstance(found.get("error"), dict):
            batch.setdefault("error", found["error"])
        return batch
    return found


def output_of(batch: dict[str, Any]) -> dict[str, Any]:
    output = batch.get("output")
    return output if isinstance(output, dict) else {}


def inline_responses(batch: dict[str, Any]) -> list[Any]:
    found = output_of(batch).get("inlinedResponses")
    # the REST shape nests the list once more, under the same name
    if isinstance(found, dict):
        found = found.get("inlinedResponses")
    return found if isinstance(found, list) else []


def batch_status(found: Any) -> BatchStatus:
    """A batch (or the Operation holding it) as a `BatchStatus`, its state in OpenAI's words.

    `output_file` is the responses file (`files/...`) of a batch that wrote one, or the batch's own
    name for one whose answers are inline, which `rows` reads again."""
    batch = batch_of(found)
    name = str(batch.get("name") or "")
    state = STATES.get(str(batch.get("state")), BatchState.IN_PROGRESS)
    created = epoch(batch.get("createTime")) or 0.0
    ended = None
    if state in (BatchState.COMPLETED, BatchState.FAILED, BatchState.CANCELLED, BatchState.EXPIRED):
        ended = epoch(batch.get("endTime")) or epoch(batch.get("updateTime")) or created
    stats = batch.get("batchStats")
    output = output_of(batch)
    responses_file = output.get("responsesFile")
    if isinstance(responses_file, str) and responses_file:
        output_file: str | None = responses_file
    else:
        output_file = name if inline_responses(batch) else None
    config = batch.get("inputConfig")
    input_file = config.get("fileName") if isinstance(config, dict) else None
    error = batch.get("error")
    problems: tuple[BatchProblem, ...] = ()
    if isinstance(error, dict) and error.get("message"):
        code = str(error.get("status") or error.get("code") or "failed")
        problems = (BatchProblem(code=code, message=str(error["message"])),)
    return BatchStatus(
        id=name,
        state=state,
        created_at=created,
        ended_at=ended,
        completed_at=ended if state == BatchState.COMPLETED else None,
        tag=tag_of(batch.get("displayName")),
        counts=BatchCounts(
            total=_number(stats, "requestCount"),
            completed=_number(stats, "successfulRequestCount"),
            failed=_number(stats, "failedRequestCount"),
        ),
        input_file=input_file if isinstance(input_file, str) and input_file else None,
        output_file=output_file,
        problems=problems,
    )


def _status_of(error: dict[str, Any]) -> int:
    status = error.get("status")
    if isinstance(status, str) and status in ERROR_STATUS:
        return ERROR_STATUS[status]
    code = error.get("code")
    if isinstance(code, int):
        return code if code >= 400 else _CODE_STATUS.get(code, 500)
    return 500


def parse_row(record: Any, created: int, model: str | None) -> BatchRow | None:
    """One answer (an inlined response or a line of the responses file: `key` at the top or in its
    `metadata`) as a `BatchRow` named by its line, the answer translated back to its line's shape;
    None for one that is not Sluice's."""
    if not isinstance(record, dict):
        return None
    metadata = record.get("metadata")
    key = record.get("key") or (metadata.get("key") if isinstance(metadata, dict) else None)
    found = _KEY.match(key) if isinstance(key, str) else None
    if found is None:
        return None
    ref, path = found.group(1), _KINDS[found.group(2)]
    response = record.get("response")
    if isinstance(response, dict):
        request_id = response.get("responseId")
        request_id = request_id if isinstance(request_id, str) else None
        body = translate.to_line_shape(path, response, created, model, request_id)
        return BatchRow(ref, 200, body, request_id)
    error = record.get("error") or record.get("status")
    if isinstance(error, dict):
        status = _status_of(error)
        code = error.get("status")
        text = f"HTTP {status}"
        if error.get("message"):
            text += f": {str(error['message'])[:_EXCERPT]}"
        if isinstance(code, str):
            text += f" ({code})"
        return BatchRow(ref, status, {"error": error}, error_code=ErrorCode.PROVIDER_ERROR, error_message=text)
    return None
