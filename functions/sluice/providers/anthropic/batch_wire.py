"""Message Batches' shapes as the batch runners read them: the ids Sluice gives a batch's requests,
a batch object as a `BatchStatus`, and a results line as a `BatchRow`.

A request's `custom_id` must match `^[a-zA-Z0-9_-]{1,64}$`, and a user's own ids need not, so a
row goes under an id Sluice makes: `<shard mark>-<part>-<attempt>-<line><kind>`. The shard mark
(a digest of the job and shard) and the part and attempt let the results of an ended batch say
which shard's file they answer (`find`); the line is the row map's key (`row_ref`); the kind says
whether the line was a chat-completions or a Responses line, whose answer is translated back to its
shape, or a native one.
The runners map the line back to the user's id through the part's row map.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any, Final

from sluice.contract.model import ErrorCode

from ..batch import BatchCounts, BatchRow, BatchState, BatchStatus, BatchTag
from . import translate

# a row's kind, the last letter of its id: a chat line (answered as a chat.completion), a Responses
# line (answered as a response) or native
CHAT_KIND: Final = "c"
RESPONSES_KIND: Final = "r"
NATIVE_KIND: Final = "m"
_KINDS = {CHAT_KIND: translate.CHAT, RESPONSES_KIND: translate.RESPONSES, NATIVE_KIND: translate.MESSAGES}
_ID = re.compile(r"^([0-9a-f]{12})-(\d+)-(\d+)-(\d+)([cmr])$")
_EXCERPT = 300
# Anthropic's error types as the HTTP status a direct call would have had
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}
_UNFINISHED = {"expired": ErrorCode.BATCH_EXPIRED, "canceled": ErrorCode.BATCH_CANCELLED}


def shard_mark(job: str, shard: int) -> str:
    """Twelve hex digits that name a job's shard within a request id."""
    return hashlib.blake2b(f"{job}\0{shard}".encode(), digest_size=6).hexdigest()


def line_ref(line: int) -> str:
    """What the runners know a row by: its input line."""
    return str(line)


def kind_of(path: str) -> str:
    return next((kind for kind, kind_path in _KINDS.items() if kind_path == path), NATIVE_KIND)


def row_prefix(tag: BatchTag) -> str:
    """The start of every request id of the tag's batch, before the line."""
    return f"{shard_mark(tag.job, tag.shard)}-{tag.part}-{tag.attempt}-"


def parse_id(custom_id: str) -> tuple[str, int, int, str, str] | None:
    """A request id Sluice made as (shard mark, part, attempt, line ref, path); None for another."""
    found = _ID.match(custom_id)
    if found is None:
        return None
    mark, part, attempt, line, kind = found.groups()
    return mark, int(part), int(attempt), line, _KINDS[kind]


def tag_of(custom_id: str, job: str, shard: int) -> BatchTag | None:
    """The tag of the batch a request id of shard `shard` of `job` was sent in; None for another's."""
    parsed = parse_id(custom_id)
    if parsed is None or parsed[0] != shard_mark(job, shard):
        return None
    return BatchTag(job, shard, parsed[1], parsed[2])


def epoch(text: Any) -> float | None:
    """An RFC 3339 time as epoch seconds; None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return at.timestamp() if at.tzinfo is not None else None


def _count(counts: Any, name: str) -> int:
    value = counts.get(name) if isinstance(counts, dict) else None
    return value if isinstance(value, int) and value >= 0 else 0


def batch_status(batch: dict[str, Any]) -> BatchStatus:
    """A Message Batch object as a `BatchStatus`, its state in OpenAI's words: an ended batch that
    was cancelled is `cancelled`, one with expired requests `expired` (its answers are kept either way)."""
    counts = batch.get("request_counts")
    succeeded, errored, canceled, expired = (
        _count(counts, name) for name in ("succeeded", "errored", "canceled", "expired")
    )
    processing = _count(counts, "processing")
    status = batch.get("processing_status")
    if status == "ended":
        if batch.get("cancel_initiated_at") or canceled:
            state = BatchState.CANCELLED
        elif expired:
            state = BatchState.EXPIRED
        else:
            state = BatchState.COMPLETED
    elif status == "canceling":
        state = BatchState.CANCELLING
    else:
        state = BatchState.IN_PROGRESS
    created = epoch(batch.get("created_at")) or 0.0
    ended = (epoch(batch.get("ended_at")) or created) if status == "ended" else None
    results = batch.get("results_url")
    return BatchStatus(
        id=str(batch.get("id", "")),
        state=state,
        created_at=created,
        ended_at=ended,
        # a Message Batch completes by ending with nothing cancelled or expired: its end is its completion
        completed_at=epoch(batch.get("ended_at")) if state == BatchState.COMPLETED else None,
        counts=BatchCounts(
            total=processing + succeeded + errored + canceled + expired,
            completed=succeeded,
            failed=errored + canceled + expired,
        ),
        output_file=results if isinstance(results, str) and results else None,
    )


def _error_message(status: int, kind: str | None, message: Any) -> str:
    text = f"HTTP {status}"
    if message:
        text += f": {str(message)[:_EXCERPT]}"
    return f"{text} ({kind})" if kind else text


def parse_row(record: dict[str, Any], created: int) -> BatchRow | None:
    """One results line as a `BatchRow` named by its line ref, a chat or Responses line's answer
    translated back to its shape (`created`: epoch seconds); None for a line that is not one of
    Sluice's rows."""
    custom_id = record.get("custom_id")
    parsed = parse_id(custom_id) if isinstance(custom_id, str) else None
    result = record.get("result")
    if parsed is None or not isinstance(result, dict):
        return None
    ref, path = parsed[3], parsed[4]
    kind = result.get("type")
    if kind == "succeeded" and isinstance(result.get("message"), dict):
        message = result["message"]
        request_id = message.get("id")
        body = translate.to_line_shape(path, message, created)
        return BatchRow(ref, 200, body, request_id if isinstance(request_id, str) else None)
    if kind in _UNFINISHED:
        return BatchRow(ref, error_code=_UNFINISHED[kind], unfinished=True)
    if kind == "errored":
        outer = result.get("error")
        inner = outer.get("error") if isinstance(outer, dict) else None
        error = inner if isinstance(inner, dict) else outer if isinstance(outer, dict) else {}
        error_type = error.get("type") if isinstance(error.get("type"), str) else None
        status = _ERROR_STATUS.get(error_type or "", 500)
        return BatchRow(
            ref,
            status,
            outer,
            error_code=ErrorCode.PROVIDER_ERROR,
            error_message=_error_message(status, error_type, error.get("message")),
        )
    return None
