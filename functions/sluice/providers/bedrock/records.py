"""Amazon Bedrock batch inference's files, read and written without a client: a request as a
`{recordId, modelInput}` input row, an output row (`{recordId, modelInput, modelOutput}` or
`{..., error: {errorCode, errorMessage}}`) as a `BatchRow`, and a job's state in OpenAI's words.

`modelInput` is the InvokeModel body of the job's model. Only Anthropic's models on Bedrock are
written here: a chat-completions or Responses line, read as the Converse body it is sent direct
(`converse.to_wire`), is written as the same request in their Messages body; a `/v1/messages` line
goes as it is; Bedrock's answers are Messages answers, given back in the shape
of the line (a chat.completion, a response). Any other model family's body is refused, so no line
is sent in a shape its model rejects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from sluice.contract.model import ErrorCode, Request

from ..anthropic.translate import CHAT, DEFAULT_MAX_TOKENS, MESSAGES, RESPONSES, to_line_shape
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


def batch_refuses(model: str | None) -> str | None:
    """Why Bedrock's batch inference, as Sluice writes its records, cannot run `model`; None if it can."""
    if anthropic_model(model):
        return None
    return f"Bedrock batch inference runs Anthropic models only here, not {model!r}"


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
    wire = body if request.path == MESSAGES else _messages_body(body)
    return {**{k: v for k, v in wire.items() if k != "model"}, "anthropic_version": ANTHROPIC_VERSION}


def _block(block: Mapping[str, Any]) -> dict[str, Any]:
    if "image" in block:
        image = block["image"]
        source = {"type": "base64", "media_type": f"image/{image['format']}", "data": image["source"]["bytes"]}
        return {"type": "image", "source": source}
    return {"type": "text", "text": block["text"]}


def _tools(config: Mapping[str, Any]) -> dict[str, Any]:
    tools = []
    for spec in (tool["toolSpec"] for tool in config["tools"]):
        tool = {"name": spec["name"], "input_schema": spec["inputSchema"]["json"]}
        if "description" in spec:
            tool["description"] = spec["description"]
        tools.append(tool)
    choice = config.get("toolChoice")
    if choice is None:
        return {"tools": tools}
    return {"tools": tools, "tool_choice": {"type": "tool", **choice["tool"]} if "tool" in choice else {"type": "any"}}


def _messages_body(converse: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages body asking what a Converse body made by `converse.to_converse` asks."""
    config = converse.get("inferenceConfig", {})
    wire: dict[str, Any] = {
        "max_tokens": config.get("maxTokens", DEFAULT_MAX_TOKENS),
        "messages": [
            {"role": turn["role"], "content": [_block(block) for block in turn["content"]]}
            for turn in converse["messages"]
        ],
    }
    if converse.get("system"):
        wire["system"] = [_block(block) for block in converse["system"]]
    for name, messages_name in (("temperature", "temperature"), ("topP", "top_p"), ("stopSequences", "stop_sequences")):
        if name in config:
            wire[messages_name] = config[name]
    if "toolConfig" in converse:
        wire.update(_tools(converse["toolConfig"]))
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
