"""Amazon Bedrock batch inference's files, read and written without a client: a request as a
`{recordId, modelInput}` input row, an output row (`{recordId, modelInput, modelOutput}` or
`{..., error: {errorCode, errorMessage}}`) as a `BatchRow`, and a job's state in OpenAI's words.

`modelInput` is the InvokeModel body of the job's model. Only Anthropic's models on Bedrock are
written here: a chat-completions line, which the shard holds as the Converse body a direct send
would take (`converse.to_wire`), is written as their Messages body; a `/v1/messages` line goes as
it is. Bedrock's answers are Messages answers, given back chat.completion-shaped for chat lines.
Any other model family's body is refused, so no line is sent in a shape its model rejects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from ...model import ErrorCode, Request
from ..anthropic.translate import CHAT, DEFAULT_MAX_TOKENS, MESSAGES, to_chat_completion
from ..batch import BatchCounts, BatchRow, BatchState
from ..format import Unsupported

ANTHROPIC_VERSION: Final = "bedrock-2023-05-31"
# a model id, or a cross-region inference profile's (`us.`, `eu.`, `apac.`, `global.` ...)
_ANTHROPIC = "anthropic."
# which dialect a job's input file is in, named by its suffix: `rows` answers a chat line as a chat.completion
SUFFIXES: Mapping[str, str] = {CHAT: ".chat.jsonl", MESSAGES: ".messages.jsonl"}

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
        raise Unsupported(f"url: Bedrock batch inference takes {CHAT} or {MESSAGES}, not {request.path}")
    wire = from_converse(body) if request.path == CHAT else {k: v for k, v in body.items() if k != "model"}
    wire["anthropic_version"] = ANTHROPIC_VERSION
    return wire


def _block(block: Any) -> dict[str, Any]:
    if isinstance(block, dict) and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    image = block.get("image") if isinstance(block, dict) else None
    source = image.get("source") if isinstance(image, dict) else None
    if isinstance(image, dict) and isinstance(source, dict) and isinstance(source.get("bytes"), str):
        data = {"type": "base64", "media_type": f"image/{image.get('format')}", "data": source["bytes"]}
        return {"type": "image", "source": data}
    raise Unsupported(f"a content block {orjson.dumps(block).decode()[:80]}: not text or an image")


def _tools(config: Mapping[str, Any]) -> dict[str, Any]:
    tools = []
    for tool in config.get("tools") or []:
        spec = tool["toolSpec"]
        described = {"description": spec["description"]} if "description" in spec else {}
        tools.append({"name": spec["name"], **described, "input_schema": spec["inputSchema"]["json"]})
    wire: dict[str, Any] = {"tools": tools}
    choice = config.get("toolChoice")
    if isinstance(choice, dict) and "any" in choice:
        wire["tool_choice"] = {"type": "any"}
    elif isinstance(choice, dict) and "tool" in choice:
        wire["tool_choice"] = {"type": "tool", "name": choice["tool"]["name"]}
    return wire


def from_converse(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Messages body, without its model, of the Converse body a chat line was translated to:
    everything `converse.to_converse` writes has its Messages equivalent."""
    messages = [
        {"role": m["role"], "content": [_block(b) for b in m.get("content") or []]} for m in body.get("messages") or []
    ]
    config = body.get("inferenceConfig") or {}
    wire: dict[str, Any] = {"max_tokens": config.get("maxTokens", DEFAULT_MAX_TOKENS), "messages": messages}
    system = [block["text"] for block in body.get("system") or []]
    if system:
        wire["system"] = "\n\n".join(system)
    for name, field in (("temperature", "temperature"), ("topP", "top_p"), ("stopSequences", "stop_sequences")):
        if config.get(name) is not None:
            wire[field] = config[name]
    if body.get("toolConfig"):
        wire.update(_tools(body["toolConfig"]))
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
        return BatchRow(ref, 200, to_chat_completion(path, output, created), output.get("id"))
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
