"""Google's Gemini dialect of the simulator: `POST /v1beta/models/{model}:generateContent` (and
`:countTokens`), as the Gemini API's REST reference gives it, and the same under /v1, which newer
SDKs ask for.

The same plan, limiter and faults as the other dialects, in Gemini's shapes: the key in
`x-goog-api-key` (or the `key` query parameter), the model in the URL, a GenerateContentRequest
(`contents` of `parts`, `systemInstruction`, `generationConfig`, `serviceTier`) whose field names
may be lowerCamelCase or snake_case as proto3 JSON allows, and whose unknown fields are refused as
Google refuses them; an answer with `candidates[].content.parts[].text`, `finishReason`,
`usageMetadata`, `modelVersion` and `responseId`; no rate-limit headers; errors as
`{"error": {"code", "message", "status", "details"}}`, a 429 `RESOURCE_EXHAUSTED` carrying its wait
as a RetryInfo `retryDelay`. A missing key is 403 PERMISSION_DENIED and a wrong one 400
INVALID_ARGUMENT with reason API_KEY_INVALID, as Google answers them. A body over the inline limit
(`SimConfig.gemini_inline_limit`, 20 MB) is refused 400. Only `gemini-*` and `gemma-*` models are
found; any other is 404 NOT_FOUND.

`serviceTier: "flex"` is Gemini's flex tier: slower by `flex_slowdown`, 429 RESOURCE_EXHAUSTED at
`flex_unavailable_rate`, refused for the models in `flex_refusing_models`, as OpenAI's flex is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from sluice_local.simulator.answers import answer_for, count_tokens, limit_text, positive_int
from sluice_local.simulator.plans import FLEX, NewId, Plan
from sluice_local.simulator.structured import Asked, Reply, conforming
from sluice_local.simulator.wire import ApiError, json_response, read_json

# the API's versions: Google's SDKs have asked for v1beta, and newer ones ask for v1
VERSIONS = ("v1beta", "v1")
_OWN_PREFIXES = ("/v1beta/", "/upload/v1beta/", "/download/v1beta/", "/upload/v1/", "/download/v1/")
API_KEY_HEADER = "x-goog-api-key"
# the tokens Gemini counts for an image of up to 384 pixels a side (larger ones are tiled)
IMAGE_TOKENS = 258
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
# google.rpc.Code of each status, as a batch writes them into its results
GRPC_CODES = {"INVALID_ARGUMENT": 3, "NOT_FOUND": 5, "RESOURCE_EXHAUSTED": 8, "INTERNAL": 13, "UNAVAILABLE": 14}
_MODEL = re.compile(r"^(gemini|gemma)-[A-Za-z0-9.\-]+$")
_TIERS = frozenset({"unspecified", "standard", FLEX, "priority"})
_REQUEST_FIELDS = frozenset(
    {
        "model",
        "contents",
        "tools",
        "toolConfig",
        "safetySettings",
        "systemInstruction",
        "generationConfig",
        "cachedContent",
        "serviceTier",
        "labels",
        "store",
    }
)
_CONFIG_FIELDS = frozenset(
    {
        "stopSequences",
        "responseMimeType",
        "responseSchema",
        "responseJsonSchema",
        "responseModalities",
        "candidateCount",
        "maxOutputTokens",
        "temperature",
        "topP",
        "topK",
        "seed",
        "presencePenalty",
        "frequencyPenalty",
        "responseLogprobs",
        "logprobs",
        "enableEnhancedCivicAnswers",
        "speechConfig",
        "thinkingConfig",
        "imageConfig",
        "mediaResolution",
    }
)
_PART_FIELDS = frozenset(
    {
        "text",
        "inlineData",
        "fileData",
        "functionCall",
        "functionResponse",
        "executableCode",
        "codeExecutionResult",
        "thought",
        "thoughtSignature",
        "videoMetadata",
        "partMetadata",
        "mediaResolution",
    }
)
_JSON_TYPES = frozenset({"application/json", "text/x.enum"})


class GeminiError(ApiError):
    """An error only Gemini answers, with its google.rpc details."""

    def __init__(self, status: int, message: str, *, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(status, message)
        self.details = list(details or [])


def speaks(request: web.Request) -> bool:
    """Whether a request is in Gemini's dialect: under v1beta, or the upload's or download's roots;
    under /v1, which OpenAI's API shares, one that carries Google's key or calls a model's method
    (`models/{model}:generateContent`)."""
    if request.path.startswith(_OWN_PREFIXES):
        return True
    if not request.path.startswith("/v1/"):
        return False
    return API_KEY_HEADER in request.headers or "key" in request.query or ":" in request.path.rsplit("/", 1)[-1]


def api_key(request: web.Request) -> str:
    """The request's key: the x-goog-api-key header, else the `key` query parameter; "" when there is none."""
    return (request.headers.get(API_KEY_HEADER) or request.query.get("key") or "").strip()


def in_upload_session(request: web.Request) -> bool:
    """Whether a request sends a file's bytes to the upload URL a resumable upload was answered with,
    which names its session and, as Google's, needs no key of its own."""
    return request.path.startswith("/upload/") and "upload_id" in request.query


def missing_key() -> GeminiError:
    return GeminiError(
        403,
        "Method doesn't allow unregistered callers (callers without established identity). "
        "Please use API Key or other form of API consumer identity to call this API.",
    )


def invalid_key() -> GeminiError:
    reason = {
        "@type": ERROR_INFO,
        "reason": "API_KEY_INVALID",
        "domain": "googleapis.com",
        "metadata": {"service": "generativelanguage.googleapis.com"},
    }
    return GeminiError(400, "API key not valid. Please pass a valid API key.", details=[reason])


def duration(millis: int) -> str:
    """A wait as a google.protobuf.Duration in JSON: "3s", "0.25s"."""
    whole, rest = divmod(max(0, millis), 1000)
    return f"{whole}s" if not rest else f"{whole}.{rest:03d}".rstrip("0") + "s"


def error_body(err: ApiError) -> dict[str, Any]:
    """`err` as Gemini writes an error, whatever part raised it: a 429 says how long to wait in a
    RetryInfo when the part gave a wait, and names the quota the limiter ran out of."""
    error = err.body.get("error")
    message = error.get("message") if isinstance(error, dict) else str(err)
    details = list(err.details) if isinstance(err, GeminiError) else []
    if err.status == 429:
        kind = error.get("type") if isinstance(error, dict) else None
        if kind in ("requests", "tokens"):
            metric = "input_token_count" if kind == "tokens" else "requests"
            quota = "InputTokensPerModelPerMinute" if kind == "tokens" else "RequestsPerMinutePerProjectPerModel"
            violation = {
                "quotaMetric": f"generativelanguage.googleapis.com/generate_content_{metric}",
                "quotaId": f"GenerateContent{quota}",
            }
            details.append({"@type": QUOTA_FAILURE, "violations": [violation]})
        wait = err.headers.get("retry-after-ms")
        if wait is not None:
            details.append({"@type": RETRY_INFO, "retryDelay": duration(int(wait))})
    body: dict[str, Any] = {"code": err.status, "message": message, "status": _STATUSES.get(err.status, "UNKNOWN")}
    if details:
        body["details"] = details
    return {"error": body}


def error_response(err: ApiError) -> web.Response:
    """An error answer as Gemini writes it: no Retry-After, which Google never sends."""
    return web.Response(body=orjson.dumps(error_body(err)), status=err.status, content_type="application/json")


def rpc_status(err: ApiError) -> dict[str, Any]:
    """`err` as the google.rpc.Status a batch writes for a request it could not answer."""
    error = err.body.get("error")
    message = error.get("message") if isinstance(error, dict) else str(err)
    return {"code": GRPC_CODES.get(_STATUSES.get(err.status, ""), 2), "message": message}


def split_spec(spec: str) -> tuple[str, str]:
    """`gemini-x:generateContent` as ("gemini-x", "generateContent"); ("gemini-x", "") without a method."""
    model, _, method = spec.partition(":")
    return model, method


def found_model(model: str, method: str) -> str:
    """`model` if the simulator has it, else the 404 Google answers."""
    if not _MODEL.match(model):
        raise ApiError(
            404,
            f"models/{model} is not found for API version v1beta, or is not supported for {method}. "
            "Call ListModels to see the list of available models and their supported methods.",
        )
    return model


def field(data: Mapping[str, Any], name: str) -> Any:
    """A field by its lowerCamelCase name or its snake_case one, as proto3 JSON accepts both."""
    if name in data:
        return data[name]
    return data.get(re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name))


def camel(name: str) -> str:
    """A field's lowerCamelCase name, given either of its names."""
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


def _refuse_unknown(data: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    for name in data:
        if camel(name) not in known:
            prefix = f"{where}." if where else ""
            raise ApiError(400, f'Invalid JSON payload received. Unknown name "{prefix}{name}": Cannot find field.')


def tier(data: Mapping[str, Any]) -> str:
    """The tier a request asks for: "flex", "priority" or "standard"; a 400 for a value Google has not."""
    asked = field(data, "serviceTier")
    if asked is None:
        return "standard"
    name = asked.lower().removeprefix("service_tier_") if isinstance(asked, str) else ""
    if name not in _TIERS:
        raise ApiError(400, f"Invalid value at 'service_tier' (type.googleapis.com/ServiceTier), {asked!r}")
    return "standard" if name == "unspecified" else name


def _parts(content: Any, where: str) -> tuple[list[str], int]:
    """The texts of a Content's parts and the tokens of its images; a 400 for a Content Google refuses."""
    if not isinstance(content, dict):
        raise ApiError(400, f"Invalid value at '{where}' (type.googleapis.com/google.ai.generativelanguage.Content)")
    _refuse_unknown(content, frozenset({"role", "parts"}), where)
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise ApiError(400, f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.")
    texts: list[str] = []
    image_tokens = 0
    for index, part in enumerate(parts):
        here = f"{where}.parts[{index}]"
        if not isinstance(part, dict):
            raise ApiError(400, f"Invalid value at '{here}' (type.googleapis.com/google.ai.generativelanguage.Part)")
        _refuse_unknown(part, _PART_FIELDS, here)
        text = part.get("text")
        blob = field(part, "inlineData")
        linked = field(part, "fileData")
        if isinstance(text, str):
            texts.append(text)
        elif isinstance(blob, dict):
            mime = field(blob, "mimeType")
            try:
                data = base64.b64decode(str(blob.get("data", "")), validate=True)
            except (binascii.Error, ValueError):
                raise ApiError(
                    400, f"Invalid value at '{here}.inline_data.data' (TYPE_BYTES), Base64 decoding failed"
                ) from None
            if not isinstance(mime, str) or not mime or not data:
                raise ApiError(400, f"* GenerateContentRequest.{here}.inline_data: mime_type and data are required")
            image_tokens += IMAGE_TOKENS
            texts.append(f"[{mime} {hashlib.blake2b(data, digest_size=4).hexdigest()}]")
        elif isinstance(linked, dict) and isinstance(field(linked, "fileUri"), str):
            image_tokens += IMAGE_TOKENS
            texts.append(f"[{field(linked, 'fileUri')}]")
        else:
            raise ApiError(400, f"* GenerateContentRequest.{here}.data: required oneof field 'data' must have one")
    return texts, image_tokens


def _prompt(data: Mapping[str, Any]) -> tuple[str, int]:
    """The request's text (its system instruction and contents) and the tokens of its images."""
    contents = data.get("contents")
    if not isinstance(contents, list) or not contents:
        raise ApiError(400, "* GenerateContentRequest.contents: contents is not specified")
    texts: list[str] = []
    images = 0
    system = field(data, "systemInstruction")
    if system is not None:
        said, tokens = _parts(system, "system_instruction")
        texts += said
        images += tokens
    for index, content in enumerate(contents):
        role = content.get("role") if isinstance(content, dict) else None
        if role not in (None, "user", "model"):
            raise ApiError(400, "Please use a valid role: user, model.")
        said, tokens = _parts(content, f"contents[{index}]")
        texts += said
        images += tokens
    return "\n".join(texts), images


def _lowered(schema: Any) -> Any:
    """An OpenAPI `responseSchema` (types in capitals) as the JSON schema `conforming` reads."""
    if isinstance(schema, list):
        return [_lowered(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _lowered(value) for key, value in schema.items()}
    if isinstance(out.get("type"), str):
        out["type"] = out["type"].lower()
    return out


def asked(config: Mapping[str, Any]) -> Asked:
    """Whether a generationConfig asks for JSON, and the schema it gives; a 400 for a schema without JSON."""
    mime = field(config, "responseMimeType")
    schema = field(config, "responseSchema")
    json_schema = field(config, "responseJsonSchema")
    if (schema is not None or json_schema is not None) and mime not in _JSON_TYPES:
        raise ApiError(
            400, "* GenerateContentRequest.generation_config.response_mime_type: must be application/json with a schema"
        )
    if mime != "application/json":
        return False, None
    if isinstance(json_schema, dict):
        return True, json_schema
    return True, _lowered(schema) if isinstance(schema, dict) else None


def _config(data: Mapping[str, Any]) -> Mapping[str, Any]:
    config = field(data, "generationConfig")
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ApiError(400, "Invalid value at 'generation_config' (type.googleapis.com/GenerationConfig)")
    _refuse_unknown(config, _CONFIG_FIELDS, "generation_config")
    temperature = config.get("temperature")
    if temperature is not None and not (isinstance(temperature, (int, float)) and 0 <= temperature <= 2):
        raise ApiError(400, "Unable to submit request because temperature must be between 0 and 2.")
    return config


def plan_gemini(model: str, data: dict[str, Any], new_id: NewId) -> Plan:
    """The plan for a GenerateContentRequest to `model`; a 400 ApiError where Gemini would refuse it."""
    _refuse_unknown(data, _REQUEST_FIELDS, "")
    served = tier(data)
    config = _config(data)
    prompt, image_tokens = _prompt(data)
    wants, schema = asked(config)
    said = answer_for(prompt)
    if wants:
        seed = hashlib.blake2b(prompt.encode(), digest_size=6).hexdigest()
        said = orjson.dumps(conforming(schema, seed) if schema is not None else {"answer": said}).decode()
    cut, truncated = limit_text(said, positive_int(field(config, "maxOutputTokens")))
    reply = Reply(cut if truncated else said, truncated)
    n = min(max(positive_int(field(config, "candidateCount")) or 1, 1), 8)
    text_tokens = count_tokens(prompt)
    pt = text_tokens + image_tokens
    ct = count_tokens(reply.text or "") * n

    def build() -> dict[str, Any]:
        candidates: list[dict[str, Any]] = []
        for index in range(n):
            if reply.refusal is not None:
                rating = {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}
                candidates.append({"finishReason": "SAFETY", "index": index, "safetyRatings": [rating]})
                continue
            candidates.append(
                {
                    "content": {"parts": [{"text": reply.text}], "role": "model"},
                    "finishReason": "MAX_TOKENS" if reply.truncated else "STOP",
                    "index": index,
                }
            )
        details = [{"modality": "TEXT", "tokenCount": text_tokens}]
        if image_tokens:
            details.append({"modality": "IMAGE", "tokenCount": image_tokens})
        out = count_tokens(reply.text or "") * n if reply.refusal is None else 0
        usage: dict[str, Any] = {
            "promptTokenCount": pt,
            "totalTokenCount": pt + out,
            "promptTokensDetails": details,
            "serviceTier": served,
        }
        if out:
            usage["candidatesTokenCount"] = out
        return {
            "candidates": candidates,
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": new_id("gsim"),
        }

    return Plan(pt, ct, build, reply, asked=(wants, schema))


def count_answer(model: str, data: dict[str, Any], new_id: NewId) -> dict[str, Any]:
    """countTokens: the prompt tokens of its `contents`, or of the `generateContentRequest` it wraps."""
    wrapped = field(data, "generateContentRequest")
    request = wrapped if isinstance(wrapped, dict) else {k: v for k, v in data.items() if k == "contents"}
    plan = plan_gemini(model, request, new_id)
    return {"totalTokens": plan.prompt_tokens}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def models_post(request: web.Request, methods: Mapping[str, Handler], inline_limit: int) -> web.StreamResponse:
    """POST /v1beta/models/{model}:{method}: the method's handler, for a model the simulator has and
    a body within the inline limit."""
    model, method = split_spec(request.match_info["spec"])
    handler = methods.get(method)
    if handler is None:
        raise ApiError(404, f"Method {method or '(none)'} is not found for models/{model}.")
    found_model(model, method)
    if request.content_length is not None and request.content_length > inline_limit:
        raise ApiError(400, f"Request payload size exceeds the limit: {inline_limit} bytes.")
    if len(await request.read()) > inline_limit:
        raise ApiError(400, f"Request payload size exceeds the limit: {inline_limit} bytes.")
    return await handler(request)


async def count_tokens_handler(request: web.Request, new_id: NewId) -> web.StreamResponse:
    _, data = await read_json(request)
    return json_response(count_answer(split_spec(request.match_info["spec"])[0], data, new_id))


# the models the model list names; any `gemini-*` or `gemma-*` model is answered
LISTED_MODELS = ("gemini-2.5-flash", "gemini-2.5-flash-lite", "gemini-2.5-pro", "gemini-2.0-flash")


def _model_resource(model: str) -> dict[str, Any]:
    return {
        "name": f"models/{model}",
        "displayName": f"{model} (simulated)",
        "inputTokenLimit": 1_048_576,
        "outputTokenLimit": 65_536,
        "supportedGenerationMethods": ["generateContent", "countTokens", "batchGenerateContent"],
    }


async def list_models(request: web.Request) -> web.StreamResponse:
    """GET /v1beta/models, which a client may ask to check its key and base URL."""
    return json_response({"models": [_model_resource(model) for model in LISTED_MODELS]})


async def get_model(request: web.Request) -> web.StreamResponse:
    model = request.match_info["spec"].removeprefix("models/")
    return json_response(_model_resource(found_model(model, "generateContent")))
