"""Amazon Bedrock's dialect of the simulator: the runtime's Converse (`POST /model/{modelId}/converse`)
and InvokeModel for Anthropic models (`POST /model/{modelId}/invoke`).

The same plan, limiter and faults as the other dialects, in Bedrock's shapes: a request signed with
SigV4 for the `bedrock` service (the simulator reads the signature's scope, whose region keys the
quota, and does not check the signature itself), the model in the URL and never in the body, a Converse
answer with `output.message`, `stopReason` and camel-case `usage`, InvokeModel's Messages answer,
the `x-amzn-RequestId` header, no rate-limit headers, and errors as a `{"message"}` body with their
type in `x-amzn-ErrorType` (429 ThrottlingException, 503 ServiceUnavailableException, ...).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

import orjson
from aiohttp import web

from sluice_local.simulator.answers import answer_for, count_tokens, limit_text, positive_int, text_of
from sluice_local.simulator.messages import plan_messages
from sluice_local.simulator.plans import NewId, Plan
from sluice_local.simulator.structured import Reply
from sluice_local.simulator.wire import ApiError

PREFIX = "/model/"
CONVERSE_ROUTE = "/model/{model}/converse"
INVOKE_ROUTE = "/model/{model}/invoke"
REQUEST_ID_HEADER = "x-amzn-RequestId"
ERROR_TYPE_HEADER = "x-amzn-ErrorType"
ANTHROPIC_VERSION = "bedrock-2023-05-31"
THROTTLED = 429
UNAVAILABLE = 503
_ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    THROTTLED: "ThrottlingException",
    500: "InternalServerException",
    UNAVAILABLE: "ServiceUnavailableException",
}
_CREDENTIAL = re.compile(r"^AWS4-HMAC-SHA256 Credential=([^/,\s]+)/\d{8}/([^/]+)/([^/]+)/aws4_request,")


def speaks(request: web.Request) -> bool:
    """Whether a request is in Bedrock's dialect: a runtime path."""
    return request.path.startswith(PREFIX)


def quota_key(request: web.Request) -> str:
    """What a signed request's quota is kept under: its region, as Bedrock's quotas are the account's
    in a region whoever signs; "" for a request not signed for the `bedrock` service."""
    found = _CREDENTIAL.match(request.headers.get("Authorization", ""))
    return f"bedrock/{found.group(2)}" if found is not None and found.group(3) == "bedrock" else ""


def signer(request: web.Request) -> tuple[str, str]:
    """The access key and region a request is signed with ("", "" when it is not)."""
    found = _CREDENTIAL.match(request.headers.get("Authorization", ""))
    return (found.group(1), found.group(2)) if found is not None else ("", "")


def invoked_model(request: web.Request) -> str:
    """The model (or inference profile) a runtime request names in its path."""
    return unquote(request.path.removeprefix(PREFIX).split("/", 1)[0])


def access_denied(message: str) -> ApiError:
    return ApiError(403, message, code="AccessDeniedException")


def missing_signature() -> ApiError:
    return ApiError(
        403,
        "Missing Authentication Token: sign the request with SigV4 for the bedrock service",
        code="MissingAuthenticationTokenException",
    )


def _model(request: web.Request, data: dict[str, Any]) -> str:
    if "model" in data:
        raise ApiError(400, "Malformed input request: extraneous key [model] is not permitted")
    return unquote(request.match_info["model"])


def _converse(model: str, data: dict[str, Any], new_id: NewId) -> Plan:
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "The messages field is required and must not be empty")
    parts = [text_of([b.get("text") for b in data.get("system") or [] if isinstance(b, dict)])]
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        parts += [b.get("text") or "" for b in content or [] if isinstance(b, dict)]
    prompt = "\n".join(p for p in parts if p)
    config = data.get("inferenceConfig")
    limit = positive_int(config.get("maxTokens")) if isinstance(config, dict) else None
    text, truncated = limit_text(answer_for(prompt), limit)
    # an output fault drawn later (`structured.spoil`) may still cut it short or make it a refusal
    reply = Reply(text, truncated)
    pt, ct = count_tokens(prompt), count_tokens(text)

    def build() -> dict[str, Any]:
        # Bedrock's refusal is a content filter's: the stop reason says so, the text says what was blocked
        said = reply.refusal if reply.refusal is not None else reply.text or ""
        stop = "content_filtered" if reply.refusal is not None else "max_tokens" if reply.truncated else "end_turn"
        return {
            "output": {"message": {"role": "assistant", "content": [{"text": said}]}},
            "stopReason": stop,
            "usage": {"inputTokens": pt, "outputTokens": ct, "totalTokens": pt + ct},
            "metrics": {"latencyMs": 1},
        }

    return Plan(pt, ct, build, reply)


def plan_bedrock(request: web.Request, data: dict[str, Any], new_id: NewId) -> Plan:
    """The plan for a Converse or InvokeModel body; a 400 ApiError where Bedrock would refuse it."""
    model = _model(request, data)
    if request.path.endswith("/converse"):
        return _converse(model, data, new_id)
    if data.get("anthropic_version") != ANTHROPIC_VERSION:
        raise ApiError(400, f"Malformed input request: anthropic_version must be {ANTHROPIC_VERSION}")
    body = {k: v for k, v in data.items() if k != "anthropic_version"}
    return plan_messages({**body, "model": model}, lambda prefix: new_id("msg_bdrk_"))


def error_response(err: ApiError, request_id: str) -> web.Response:
    """An error answer as Bedrock writes it, whatever part raised it: no Retry-After, which Bedrock never sends."""
    error = err.body.get("error")
    message = error.get("message") if isinstance(error, dict) else str(err)
    code = error.get("code") if isinstance(error, dict) else None
    kind = code if isinstance(code, str) and code.endswith("Exception") else _ERROR_TYPES.get(err.status)
    headers = {ERROR_TYPE_HEADER: kind or "InternalServerException", REQUEST_ID_HEADER: request_id}
    return web.Response(
        body=orjson.dumps({"message": message}), status=err.status, headers=headers, content_type="application/json"
    )
