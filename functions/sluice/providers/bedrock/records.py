"""Amazon Bedrock batch inference's files, read and written without a client: a request as a
`{recordId, modelInput}` input row, an output row (`{recordId, modelInput, modelOutput}` or
`{..., error: {errorCode, errorMessage}}`) as a `BatchRow`, and a job's state in OpenAI's words.

`modelInput` is the InvokeModel body of the job's model. Only Anthropic's models on Bedrock are
written here: a chat-completions or Responses line is translated to their Messages body, a
`/v1/messages` line goes as it is; Bedrock's answers are Messages answers, given back in the shape
of the line (a chat.completion, a response). Any other model family's body is refused, so no line
is sent in a shape its model rejects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from ...model import ErrorCode, Request
from ..anthropic.translate import CHAT, MESSAGES, RESPONSES, to_line_shape, to_messages
from ..batch import BatchCounts, BatchRow, BatchState
from ..format import Unsupported

ANTHROPIC_VERSION: Final = "bedrock-2023-05-31"
# a model id, or a cross-region inference profile's (`us.`, `eu.`, `apac.`, `global.` ...)
_ANTHROPIC = "anthropic."
# which dialect a job's input file is in, named by its suffix: `output_row` answers each in its shape
SUFFIXES: Mapping[str, str] = {CHAT: ".chat.jsonl", RESPONSES: ".responses.jsonl", MESSAGES: ".messages.jsonl"}

# Bedrock's job states, in OpenAI's words: a partly completed job is a completed one whose records
# with no answer go direct (`unfinished_code`)
STATES: Mapping[str, str] = {
    "Submitted": BatchState.VALIDATING,
    "Validating": BatchState.VALIDATING,
    "Scheduled": BatchState.VALIDATING,
    "InProgress": BatchState.IN_PROGRESS,
    "Stopping": BatchState.CANCELLING,
    "Completed": BatchState.COMPLETED,
    "PartiallyCompleted": BatchState.COMPLETED,
    "Failed": BatchState.FAILED,
    "Stopped": BatchState.CANCELLED,
    "Expired": BatchState.EXPIRED,
}
# the states that hold a place among the model's concurrent jobs
ACTIVE = ("Submitted", "Validating", "Scheduled", "InProgress", "Stopping")
# what a record with no answer in an ended job is, by how the job ended
_UNFINISHED = {
    "Expired": ErrorCode.BATCH_EXPIRED,
    "Stopped": ErrorCode.BATCH_CANCELLED,
    "PartiallyCompleted": ErrorCode.BATCH_FAILED,
    "Completed": ErrorCode.BATCH_FAILED,
}
# a record's error that another try may not repeat: throttled or the model unavailable
_RETRYABLE = frozenset({408, 424, 429, 500, 502, 503, 504})
_EXCERPT = 300


def anthropic_model(model: str | None) -> bool:
    if not model:
        return False
    head, _, rest = model.partition(".")
    return model.startswith(_ANTHROPIC) or (head.isalpha() and rest.startswith(_ANTHROPIC))


def model_input(request: Request) -> dict[str, Any]:
    """The InvokeModel body of a request for an Anthropic model on Bedrock; raises `Unsupported` for
    another model family or a field Messages cannot honour."""
    body = orjson.loads(request.body or b"{}")
    if not isinstance(body, dict):
        raise Unsupported("body: a JSON object")
    model = body.get("model")
    if not anthropic_model(model if isinstance(model, str) else None):
        raise Unsupported(f"model: Bedrock batch inference runs Anthropic models only here, not {model!r}")
    if request.path not in SUFFIXES:
        raise Unsupported(f"url: Bedrock batch inference takes {', '.join(SUFFIXES)}, not {request.path}")
    wire = {k: v for k, v in to_messages(request.path, body).items() if k != "model"}
    wire["anthropic_version"] = ANTHROPIC_VERSION
    return wire


def record(ref: str, request: Request) -> bytes:
    """The request as one row of a job's input file, newline included."""
    return orjson.dumps({"recordId": ref, "modelInput": model_input(request)}) + b"\n"


def dialect(input_key: str) -> str:
    """The endpoint of the lines of a job's input file, from its name."""
    return next((path for path, suffix in SUFFIXES.items() if input_key.endswith(suffix)), MESSAGES)


def output_row(row: Mapping[str, Any], path: str, created: int) -> BatchRow | None:
    """One `.jsonl.out` row as a `BatchRow`; None when it says nothing usable."""
    ref = row.get("recordId")
    if not isinstance(ref, str):
        return None
    output = row.get("modelOutput")
    if isinstance(output, dict):
        return BatchRow(ref, 200, to_line_shape(path, output, created), output.get("id"))
    error = row.get("error")
    if not isinstance(error, dict):
        return None
    code = error.get("errorCode")
    message = str(error.get("errorMessage") or "Bedrock reported an error without a message")[:_EXCERPT]
    if isinstance(code, int) and code in _RETRYABLE:
        # not an answer to the line: it goes direct, like a record the job never ran
        return BatchRow(ref, error_code=ErrorCode.BATCH_FAILED, error_message=message, unfinished=True)
    status = code if isinstance(code, int) else None
    body = {"error": {"code": code, "message": message}}
    return BatchRow(ref, status, body, error_code=ErrorCode.PROVIDER_ERROR, error_message=f"HTTP {code}: {message}")


def unfinished_code(state: str) -> str | None:
    """The code of a record an ended job left with no answer (None: the job had not ended)."""
    return _UNFINISHED.get(state, ErrorCode.BATCH_FAILED if state == "Failed" else None)


def counts(manifest: Mapping[str, Any]) -> BatchCounts:
    """A job's `manifest.json.out` as counts."""

    def number(name: str) -> int:
        value = manifest.get(name)
        return value if isinstance(value, int) and value >= 0 else 0

    return BatchCounts(number("totalRecordCount"), number("successRecordCount"), number("errorRecordCount"))
