"""A small Gemini-compatible server on 127.0.0.1, written from Google's REST reference of the Gemini
API and independent of Sluice: it imports nothing of `sluice` or `local`, and answers
`POST /{v1beta,v1}/models/{model}:generateContent` (and lists two models at `GET /{v1beta,v1}/models`)
with a GenerateContentResponse
(candidates[].content.parts[].text, finishReason, usageMetadata, modelVersion, responseId) in its own
words, a digest of the prompt it was given, so a run's results show whose answers they are.

It takes only requests that carry an API key in `x-goog-api-key` (or the `key` query parameter), as
Google does (403 PERMISSION_DENIED without one; with `--key`, 400 API_KEY_INVALID for any other), and
records a digest of each key it saw, never the key. It refuses, with Google's 400 INVALID_ARGUMENT
body, a request the reference does not allow: a field it does not name (snake_case or lowerCamelCase,
as proto3 JSON reads both), no `contents`, a role other than user or model, a part with no data, a
temperature outside [0, 2]. `--throttle-every N` answers every Nth request 429 RESOURCE_EXHAUSTED
with a RetryInfo `retryDelay`, as Google's quota does.

    .venv/bin/python bench/gemini_server.py --port 8766
    GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:8766 GEMINI_API_KEY=any \\
      .venv/bin/sluice run examples/reviews.jsonl --provider gemini --model gemini-2.5-flash --out out
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

ANSWER_PREFIX = "gemini-server answers: "


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# the fields the REST reference gives a GenerateContentRequest, its GenerationConfig and a Part
_REQUEST = _names(
    "model contents tools toolConfig safetySettings systemInstruction generationConfig cachedContent "
    "serviceTier labels store"
)
_GENERATION = _names(
    "stopSequences responseMimeType responseSchema responseJsonSchema responseModalities candidateCount "
    "maxOutputTokens temperature topP topK seed presencePenalty frequencyPenalty responseLogprobs logprobs "
    "enableEnhancedCivicAnswers speechConfig thinkingConfig imageConfig mediaResolution"
)
_PART_DATA = _names("text inlineData fileData functionCall functionResponse executableCode")
_PART = _PART_DATA | _names("codeExecutionResult thought thoughtSignature videoMetadata partMetadata")


class Refused(Exception):
    def __init__(self, status: int, google_status: str, message: str, details: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.status, self.google_status, self.details = status, google_status, details or []

    def answer(self) -> web.Response:
        error: dict[str, Any] = {"code": self.status, "message": str(self), "status": self.google_status}
        if self.details:
            error["details"] = self.details
        return web.json_response({"error": error}, status=self.status)


def _camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


def _plain(data: dict[str, Any], allowed: frozenset[str], where: str) -> dict[str, Any]:
    """`data` with every name lowerCamelCase; a 400 for a name the reference does not give."""
    named = {}
    for name, value in data.items():
        if _camel(name) not in allowed:
            raise Refused(400, "INVALID_ARGUMENT", f'Invalid JSON payload received. Unknown name "{where}{name}"')
        named[_camel(name)] = value
    return named


def _texts(content: Any, where: str) -> list[str]:
    if not isinstance(content, dict) or not isinstance(content.get("parts"), list) or not content["parts"]:
        raise Refused(400, "INVALID_ARGUMENT", f"* GenerateContentRequest.{where}.parts: must not be empty")
    if content.get("role") not in (None, "user", "model"):
        raise Refused(400, "INVALID_ARGUMENT", "Please use a valid role: user, model.")
    said = []
    for index, raw in enumerate(content["parts"]):
        part = _plain(raw if isinstance(raw, dict) else {}, _PART, f"{where}.parts[{index}].")
        if not _PART_DATA & part.keys():
            raise Refused(400, "INVALID_ARGUMENT", f"* {where}.parts[{index}].data: required oneof field 'data'")
        said.append(part["text"] if isinstance(part.get("text"), str) else json.dumps(part, sort_keys=True))
    return said


def read_request(data: Any) -> tuple[str, dict[str, Any]]:
    """The prompt of a GenerateContentRequest and its generation config, as the REST reference reads them."""
    if not isinstance(data, dict):
        raise Refused(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
    request = _plain(data, _REQUEST, "")
    contents = request.get("contents")
    if not isinstance(contents, list) or not contents:
        raise Refused(400, "INVALID_ARGUMENT", "* GenerateContentRequest.contents: contents is not specified")
    said = _texts(request["systemInstruction"], "system_instruction") if "systemInstruction" in request else []
    for index, content in enumerate(contents):
        said += _texts(content, f"contents[{index}]")
    config = request.get("generationConfig") or {}
    if not isinstance(config, dict):
        raise Refused(400, "INVALID_ARGUMENT", "Invalid value at 'generation_config'")
    config = _plain(config, _GENERATION, "generation_config.")
    temperature = config.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise Refused(400, "INVALID_ARGUMENT", "temperature must be between 0 and 2.")
    return "\n".join(said), config


@dataclass
class GeminiServer:
    key: str | None = None  # the only key taken; None: any
    throttle_every: int = 0
    retry_delay_s: int = 1
    base_url: str = ""
    # what it was asked: requests, those answered, by model, by a digest of their key, refused by status
    requests: int = 0
    answered: int = 0
    models: Counter[str] = field(default_factory=Counter)
    key_digests: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)

    async def generate(self, request: web.Request) -> web.Response:
        self.requests += 1
        try:
            return self._answer(request, await request.json())
        except Refused as refused:
            self.refused[refused.google_status] += 1
            return refused.answer()
        except json.JSONDecodeError:
            self.refused["INVALID_ARGUMENT"] += 1
            return Refused(400, "INVALID_ARGUMENT", "Invalid JSON payload received.").answer()

    def _key(self, request: web.Request) -> str:
        """The request's key, or Google's refusal: 403 without one, 400 API_KEY_INVALID for a wrong one."""
        key = (request.headers.get("x-goog-api-key") or request.query.get("key") or "").strip()
        if not key:
            raise Refused(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers.")
        if self.key is not None and key != self.key:
            info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}
            raise Refused(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", [info])
        return key

    def _answer(self, request: web.Request, data: Any) -> web.Response:
        model, _, method = request.match_info["spec"].partition(":")
        if method != "generateContent":
            raise Refused(404, "NOT_FOUND", f"Method {method} is not found for models/{model}.")
        key = self._key(request)
        prompt, config = read_request(data)
        if self.throttle_every and self.requests % self.throttle_every == 0:
            retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{self.retry_delay_s}s"}
            raise Refused(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).", [retry])
        self.answered += 1
        self.models[model] += 1
        self.key_digests[hashlib.sha256(key.encode()).hexdigest()[:12]] += 1
        words = len(prompt.split())
        text = f"{ANSWER_PREFIX}{words} words, digest {hashlib.sha256(prompt.encode()).hexdigest()[:12]}"
        if config.get("responseMimeType") == "application/json":
            text = json.dumps({"answer": text})
        return web.json_response(
            {
                "candidates": [{"content": {"parts": [{"text": text}], "role": "model"}, "finishReason": "STOP"}],
                "usageMetadata": {
                    "promptTokenCount": words,
                    "candidatesTokenCount": 6,
                    "totalTokenCount": words + 6,
                },
                "modelVersion": model,
                "responseId": hashlib.sha256(f"{self.requests}:{prompt}".encode()).hexdigest()[:20],
            }
        )

    async def list_models(self, request: web.Request) -> web.Response:
        """The model list, which a client may read to check its key and base URL."""
        try:
            self._key(request)
        except Refused as refused:
            self.refused[refused.google_status] += 1
            return refused.answer()
        names = ("gemini-2.5-flash", "gemini-2.5-pro")
        listed = [{"name": f"models/{n}", "supportedGenerationMethods": ["generateContent"]} for n in names]
        return web.json_response({"models": listed})

    def app(self) -> web.Application:
        app = web.Application()
        for version in ("v1beta", "v1"):
            app.router.add_post(f"/{version}/models/{{spec}}", self.generate)
            app.router.add_get(f"/{version}/models", self.list_models)
        return app


class Running:
    """The server on a thread of its own, for a test or a bench that runs `sluice run` beside it."""

    def __init__(self, server: GeminiServer) -> None:
        self.server = server
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="gemini-server", daemon=True)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        runner = web.AppRunner(self.server.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.server.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._started.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> GeminiServer:
        self._thread.start()
        if not self._started.wait(timeout=30):
            raise RuntimeError("the Gemini server did not start")
        return self.server

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--key", default=None, help="take only this API key (default: any)")
    parser.add_argument("--throttle-every", type=int, default=0, metavar="N", help="answer every Nth request 429")
    args = parser.parse_args()
    server = GeminiServer(key=args.key, throttle_every=args.throttle_every)
    print(json.dumps({"listening": f"http://127.0.0.1:{args.port}"}), flush=True)
    web.run_app(server.app(), host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
