"""The simulator as an aiohttp application: its parts wired together, the /v1 and /sim routes.

Every /v1 answer is labelled (`Server: sluice-simulator`, an x-request-id), carries the
x-ratelimit-* headers and is written to the request log; `/v1/messages` and its Message Batches
(`message_batches`) speak Anthropic's dialect instead (`messages`: x-api-key, request-id,
anthropic-ratelimit-*, its error body), the Bedrock runtime's paths Bedrock's (`bedrock`), and
those under /v1beta (and its upload and download roots) Gemini's (`gemini`: x-goog-api-key, no
rate-limit headers, Google's error body). Admin endpoints outside /v1:
GET/DELETE /sim/log, GET/DELETE /sim/webhooks, GET/POST /sim/config (partial update),
GET /sim/health, POST /sim/reset.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web

from sluice_local.simulator import bedrock, gemini, requestlog
from sluice_local.simulator.background import Background, BgResponse
from sluice_local.simulator.batches import Batch, Batches
from sluice_local.simulator.config import SimConfig
from sluice_local.simulator.core import Core
from sluice_local.simulator.files import File, Files
from sluice_local.simulator.gemini_batches import GeminiBatches
from sluice_local.simulator.gemini_files import GeminiFiles
from sluice_local.simulator.inference import Inference
from sluice_local.simulator.limits import Limiter
from sluice_local.simulator.message_batches import MessageBatches
from sluice_local.simulator.messages import MESSAGES_PATH, REQUEST_ID_HEADER, error_response, speaks
from sluice_local.simulator.messages import ratelimit_headers as messages_ratelimit_headers
from sluice_local.simulator.plans import BATCH_ENDPOINTS
from sluice_local.simulator.requestlog import NOTES
from sluice_local.simulator.webhooks import Webhooks
from sluice_local.simulator.wire import SERVER_HEADER, ApiError, Dropped, json_response

log = logging.getLogger(__name__)


class Simulator:
    """One simulator: its parts, the request log and the admin routes. All methods run on its event loop."""

    def __init__(self, config: SimConfig, *, clock: Callable[[], float] | None = None) -> None:
        self.core = Core(config)
        # whether the signer of a Bedrock request may invoke its model: (access key, region, model)
        # -> None, or why not. The local cloud's IAM sets it; None lets every signer through
        self.authorize_invoke: Callable[[str, str, str], str | None] | None = None
        self.log: deque[dict[str, Any]] = deque(maxlen=config.log_limit)
        self.webhooks = Webhooks(self.core)
        self.file_api = Files(self.core)
        self.background = Background(self.core, self.webhooks.emit)
        self.batch_api = Batches(self.core, self.file_api, self.webhooks.emit)
        self.message_batches = MessageBatches(self.core)
        self.gemini_files = GeminiFiles(self.core)
        self.gemini_batches = GeminiBatches(self.core, self.gemini_files)
        self.limiter = Limiter(clock or self.core.now)
        self.inference = Inference(self.core, self._admit, self.background)

    @property
    def config(self) -> SimConfig:
        return self.core.config

    @property
    def webhook_log(self) -> deque[dict[str, Any]]:
        return self.webhooks.log

    # the parts' state under the names tests inspect through SimulatorServer.call
    @property
    def attempts(self) -> dict[str, int]:
        return self.core.attempts

    @property
    def responses(self) -> dict[str, BgResponse]:
        return self.background.responses

    @property
    def files(self) -> dict[str, File]:
        return self.file_api.files

    @property
    def deleted_files(self) -> dict[str, File]:
        return self.file_api.deleted

    @property
    def batches(self) -> dict[str, Batch]:
        return self.batch_api.batches

    def update_config(self, changes: Mapping[str, Any]) -> SimConfig:
        config = self.config.updated(changes)
        if config.log_limit != self.config.log_limit:
            self.log = deque(self.log, maxlen=config.log_limit)
            self.webhooks.resize(config.log_limit)
        self.core.config = config
        return config

    def reset(self) -> None:
        self.background.reset()
        self.batch_api.reset()
        self.message_batches.reset()
        self.gemini_batches.reset()
        self.gemini_files.reset()
        self.file_api.reset()
        self.log.clear()
        self.webhooks.log.clear()
        self.core.attempts.clear()
        self.limiter.reset()

    async def close(self, _app: web.Application | None = None) -> None:
        await self.webhooks.close()

    def _admit(self, request: web.Request, tokens: int) -> None:
        self.limiter.admit(self.config, _api_key(request), tokens)

    def ratelimit_headers(self, request: web.Request) -> dict[str, str]:
        if bedrock.speaks(request) or gemini.speaks(request):
            return {}
        if speaks(request):
            return messages_ratelimit_headers(self.limiter.levels(self.config, _api_key(request)))
        return self.limiter.headers(self.config, _api_key(request))

    def check_auth(self, request: web.Request) -> None:
        if bedrock.speaks(request):
            if not bedrock.quota_key(request):
                raise bedrock.missing_signature()
            if self.authorize_invoke is not None:
                key, region = bedrock.signer(request)
                why = self.authorize_invoke(key, region, bedrock.invoked_model(request))
                if why is not None:
                    raise bedrock.access_denied(why)
            return
        token = _api_key(request)
        if gemini.speaks(request):
            if gemini.in_upload_session(request):
                return
            if not token:
                raise gemini.missing_key()
            if self.config.api_key is not None and not secrets.compare_digest(token, self.config.api_key):
                raise gemini.invalid_key()
            return
        if not token:
            raise ApiError(
                401,
                "You didn't provide an API key. Provide it as a Bearer token in the Authorization header.",
                code="missing_api_key",
            )
        expected = self.config.api_key
        if expected is not None and not secrets.compare_digest(token, expected):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    async def gemini_models(self, request: web.Request) -> web.StreamResponse:
        """POST /v1beta/models/{model}:{method}, Gemini's model methods."""
        methods = {
            "generateContent": self.inference.infer,
            "countTokens": lambda r: gemini.count_tokens_handler(r, self.core.new_id),
            "batchGenerateContent": self.gemini_batches.create,
        }
        return await gemini.models_post(request, methods, self.config.gemini_inline_limit)

    async def list_models(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/models, which OpenAI-compatible servers answer (and `sluice run` asks before a
        job): the simulator answers any model, so these are only the ones usually asked for."""
        created = int(self.core.started)
        data = [{"id": name, "object": "model", "created": created, "owned_by": "sluice-simulator"} for name in MODELS]
        return json_response({"object": "list", "data": data})

    async def admin_log(self, request: web.Request) -> web.StreamResponse:
        if request.method == "DELETE":
            self.log.clear()
            return json_response({"cleared": True})
        return json_response(list(self.log))

    async def admin_webhooks(self, request: web.Request) -> web.StreamResponse:
        if request.method == "DELETE":
            self.webhooks.log.clear()
            return json_response({"cleared": True})
        return json_response(list(self.webhooks.log))

    async def admin_config(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            try:
                changes = orjson.loads(await request.read())
                if not isinstance(changes, dict):
                    raise ValueError("expected a JSON object")
                self.update_config(changes)
            except (ValueError, orjson.JSONDecodeError) as exc:
                return json_response({"error": {"message": str(exc), "type": "invalid_request_error"}}, status=400)
        return json_response(self.config.public())

    async def admin_health(self, request: web.Request) -> web.StreamResponse:
        return json_response(
            {
                "status": "ok",
                "simulator": True,
                "uptime_s": round(time.time() - self.core.started, 3),
                "logged_requests": len(self.log),
            }
        )

    async def admin_reset(self, request: web.Request) -> web.StreamResponse:
        self.reset()
        return json_response({"reset": True})


SIM_KEY = web.AppKey("sluice_simulator", Simulator)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1-mini", "gpt-4.1-nano", "text-embedding-3-small")


def _api_key(request: web.Request) -> str:
    """The request's key: Anthropic's x-api-key header on the Messages path or with its version
    header (a models list asked as Anthropic's SDK asks it), else the bearer token of the
    Authorization header, or the region of Bedrock's signature, which keys its quota, or Gemini's
    x-goog-api-key; "" when there is none."""
    if bedrock.speaks(request):
        return bedrock.quota_key(request)
    if gemini.speaks(request):
        return gemini.api_key(request)
    if speaks(request) or "anthropic-version" in request.headers:
        return request.headers.get("x-api-key", "").strip()
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _error_response(request: web.Request, err: ApiError, request_id: str) -> web.Response:
    """`err` in the dialect of the request it answers."""
    if bedrock.speaks(request):
        return bedrock.error_response(err, request_id)
    if gemini.speaks(request):
        return gemini.error_response(err)
    return error_response(err, request_id) if speaks(request) else err.response()


@web.middleware
async def _middleware(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    if not request.path.startswith("/v1/") and not bedrock.speaks(request) and not gemini.speaks(request):
        response: web.StreamResponse = await handler(request)
        response.headers["Server"] = SERVER_HEADER
        return response
    sim = request.app[SIM_KEY]
    request[NOTES] = {}
    request_id = sim.core.new_id("req_")
    started = time.time()
    try:
        sim.check_auth(request)
        response = await handler(request)
    except ApiError as err:
        response = _error_response(request, err, request_id)
    except web.HTTPException as exc:
        unknown = ApiError(exc.status, f"Invalid URL ({request.method} {request.path})", code="unknown_url")
        response = _error_response(request, unknown, request_id)
    except Dropped:
        sim.log.append(requestlog.entry(request, started, None, request_id))
        if request.transport is not None:
            request.transport.close()
        # ending the handler this way makes aiohttp abandon the request without writing
        raise asyncio.CancelledError() from None
    except Exception:
        log.exception("simulator bug while handling %s %s", request.method, request.path)
        response = ApiError(500, "The simulator failed.", type="server_error", code="simulator_error").response()
    headers = response.headers
    headers["Server"] = SERVER_HEADER
    if bedrock.speaks(request):
        headers[bedrock.REQUEST_ID_HEADER] = request_id
    elif not gemini.speaks(request):
        headers[REQUEST_ID_HEADER if speaks(request) else "x-request-id"] = request_id
    headers.update(sim.ratelimit_headers(request))
    sim.log.append(requestlog.entry(request, started, response.status, request_id))
    return response


def _by_dialect(openai: Handler, google: Handler) -> Handler:
    """One /v1 route both OpenAI's API and Gemini's have: each request answered by its own."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await (google if gemini.speaks(request) else openai)(request)

    return handle


def create_app(config: SimConfig | None = None, *, clock: Callable[[], float] | None = None) -> web.Application:
    """The simulator as an aiohttp application (the state is `app[SIM_KEY]`); `clock` drives the rate limits."""
    sim = Simulator(config or SimConfig(), clock=clock)
    # batch input files can be large; providers accept up to a few hundred MB
    app = web.Application(middlewares=[_middleware], client_max_size=256 * 1024 * 1024)
    app[SIM_KEY] = sim
    app.on_cleanup.append(sim.close)
    for path in BATCH_ENDPOINTS:
        app.router.add_post(path, sim.inference.infer)
    app.router.add_post(MESSAGES_PATH, sim.inference.infer)
    sim.message_batches.routes(app)
    app.router.add_post(bedrock.CONVERSE_ROUTE, sim.inference.infer)
    app.router.add_post(bedrock.INVOKE_ROUTE, sim.inference.infer)
    for version in gemini.VERSIONS:
        app.router.add_post(f"/{version}/models/{{spec}}", sim.gemini_models)
        app.router.add_get(f"/{version}/models/{{spec}}", gemini.get_model)
        if version != "v1":
            app.router.add_get(f"/{version}/models", gemini.list_models)
        sim.gemini_files.routes(app, version)
        sim.gemini_batches.routes(app, version)
    app.router.add_get("/v1/models", _by_dialect(sim.list_models, gemini.list_models))
    app.router.add_get("/v1/responses/{id}", sim.background.retrieve)
    app.router.add_delete("/v1/responses/{id}", sim.background.delete)
    app.router.add_post("/v1/responses/{id}/cancel", sim.background.cancel)
    app.router.add_post("/v1/files", sim.file_api.upload)
    app.router.add_get("/v1/files", _by_dialect(sim.file_api.list_files, sim.gemini_files.list_files))
    app.router.add_get("/v1/files/{id}", _by_dialect(sim.file_api.retrieve, sim.gemini_files.retrieve))
    app.router.add_delete("/v1/files/{id}", _by_dialect(sim.file_api.delete, sim.gemini_files.delete))
    app.router.add_get("/v1/files/{id}/content", sim.file_api.content)
    app.router.add_post("/v1/batches", sim.batch_api.create)
    app.router.add_get("/v1/batches", _by_dialect(sim.batch_api.list_batches, sim.gemini_batches.list_batches))
    app.router.add_get("/v1/batches/{id}", _by_dialect(sim.batch_api.retrieve, sim.gemini_batches.retrieve))
    app.router.add_post("/v1/batches/{id}/cancel", sim.batch_api.cancel)
    app.router.add_route("GET", "/sim/log", sim.admin_log)
    app.router.add_route("DELETE", "/sim/log", sim.admin_log)
    app.router.add_route("GET", "/sim/webhooks", sim.admin_webhooks)
    app.router.add_route("DELETE", "/sim/webhooks", sim.admin_webhooks)
    app.router.add_get("/sim/config", sim.admin_config)
    app.router.add_post("/sim/config", sim.admin_config)
    app.router.add_get("/sim/health", sim.admin_health)
    app.router.add_post("/sim/reset", sim.admin_reset)
    return app


async def start(
    config: SimConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    shutdown_timeout: float = 1.0,
    clock: Callable[[], float] | None = None,
) -> tuple[web.AppRunner, int]:
    """Start the simulator on the running loop; returns the runner (to clean up) and the port."""
    runner = web.AppRunner(create_app(config, clock=clock), access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, int(bound)


async def serve(host: str = "127.0.0.1", port: int = 8000, config: SimConfig | None = None) -> None:
    """Run the simulator until cancelled."""
    runner, bound = await start(config, host, port)
    print(f"sluice provider simulator listening on http://{host}:{bound}/v1", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
