"""The inference endpoints (chat/completions, completions, responses, embeddings; Anthropic's messages)
and their faults.

Every inference POST has a fault key: the x-sluice-custom-id header, else
`metadata.custom_id` / `metadata.sluice_custom_id` in the body, else the path plus a hash of
the body bytes. Requests the limiter rejects do not advance the key's attempt counter, so
timing-dependent throttling never shifts the fault sequence of a key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from sluice_local.simulator import gemini as gemini_dialect
from sluice_local.simulator.background import Background
from sluice_local.simulator.bedrock import UNAVAILABLE, plan_bedrock
from sluice_local.simulator.bedrock import speaks as speaks_bedrock
from sluice_local.simulator.core import Core
from sluice_local.simulator.faults import (
    FAULT_429,
    FAULT_500,
    FAULT_DROP,
    FAULT_FLEX_UNAVAILABLE,
    FAULT_QUEUE_WAIT,
    FAULT_RATE_LIMIT,
    FAULT_SLOW,
    body_key,
    draws,
    flex_unavailable,
    pick_fault,
)
from sluice_local.simulator.messages import OVERLOADED, plan_messages, speaks
from sluice_local.simulator.plans import FLEX, plan_for, served_tier
from sluice_local.simulator.requestlog import NOTES
from sluice_local.simulator.structured import pick_output_fault, spoil
from sluice_local.simulator.wire import CUSTOM_ID_HEADER, ApiError, Dropped, json_response, read_json, retry_headers

# charges a request's tokens to the rate limits, or raises their 429
Admit = Callable[[web.Request, int], None]


class Inference:
    """Answers inference POSTs: plan, admit, draw the fault, wait, answer."""

    def __init__(self, core: Core, admit: Admit, background: Background) -> None:
        self._core = core
        self._admit = admit
        self._background = background

    async def infer(self, request: web.Request) -> web.StreamResponse:
        raw, data = await read_json(request)
        custom_id = request.headers.get(CUSTOM_ID_HEADER)
        if custom_id is None:
            metadata = data.get("metadata")
            if isinstance(metadata, dict):
                found = metadata.get("custom_id", metadata.get("sluice_custom_id"))
                if isinstance(found, str):
                    custom_id = found
                    request[NOTES]["custom_id"] = found
        cfg = self._core.config
        messages = speaks(request)
        bedrock = speaks_bedrock(request)
        gemini = gemini_dialect.speaks(request)
        model = data.get("model")
        tier: str | None = None
        if messages:
            plan = plan_messages(data, self._core.new_id, self._core.prompt_cache)
        elif bedrock:
            plan = plan_bedrock(request, data, self._core.new_id)
        elif gemini:
            model = gemini_dialect.split_spec(request.match_info["spec"])[0]
            plan = gemini_dialect.plan_gemini(model, data, self._core.new_id)
            tier = gemini_dialect.tier(data)
        else:
            plan = plan_for(request.path, data, self._core.new_id, cfg.embedding_dims)
            tier = served_tier(data)
        # the journal shows the tier each OpenAI or Gemini request was served at, so a test can see flex was asked
        request[NOTES]["service_tier"] = tier
        if tier == FLEX and model in cfg.flex_refusing_models.split(","):
            raise ApiError(
                400,
                f"Unsupported service_tier: flex is not available for model {model} (simulated).",
                param="service_tier",
                code="invalid_value",
            )
        try:
            self._admit(request, plan.prompt_tokens + plan.completion_tokens)
        except ApiError:
            request[NOTES]["fault"] = FAULT_RATE_LIMIT
            raise
        key = custom_id if custom_id is not None else body_key(request.path, raw)
        attempt = self._core.next_attempt(key)
        request[NOTES]["attempt"] = attempt
        u_fault, u_jitter, u_outcome = draws(cfg.seed, key, attempt)
        fault = pick_fault(cfg, u_fault)
        request[NOTES]["fault"] = fault
        if tier == FLEX and flex_unavailable(cfg, key, attempt):
            request[NOTES]["fault"] = FAULT_FLEX_UNAVAILABLE
            raise ApiError(
                429,
                "Resource unavailable: flex processing has no capacity for this request right now "
                "(simulated fault). Please try again later, or send it at the default tier.",
                type="rate_limit_error",
                code="resource_unavailable",
            )
        delay = (cfg.latency_s + cfg.jitter_s * u_jitter) * (cfg.flex_slowdown if tier == FLEX else 1.0)
        if fault == FAULT_429:
            raise ApiError(
                429,
                "Rate limit reached for requests (simulated fault). Please try again later.",
                type="requests",
                code="rate_limit_exceeded",
                headers=retry_headers(cfg.retry_after_s),
            )
        if fault == FAULT_SLOW:
            delay = cfg.slow_s
        background = request.path == "/v1/responses" and bool(data.get("background"))
        if fault == FAULT_QUEUE_WAIT:
            limit = data.get("max_queue_wait_s")
            if isinstance(limit, (int, float)) and not isinstance(limit, bool):
                delay = min(delay, max(0.0, float(limit)))
        if delay > 0 and (fault in (FAULT_500, FAULT_DROP, FAULT_QUEUE_WAIT) or not background):
            await asyncio.sleep(delay)
        if fault == FAULT_500:
            raise ApiError(
                500,
                "The server had an error while processing your request (simulated fault).",
                type="server_error",
                code="server_error",
            )
        if fault == FAULT_DROP:
            raise Dropped()
        if fault == FAULT_QUEUE_WAIT:
            # Anthropic's congestion: overloaded for everyone; Bedrock's and Gemini's: unavailable
            status = OVERLOADED if messages else UNAVAILABLE if bedrock or gemini else cfg.queue_wait_status
            raise ApiError(
                status,
                "The request waited in the queue longer than allowed (simulated fault).",
                type="server_error" if status >= 500 else "requests",
                code="queue_wait_exceeded",
                headers=retry_headers(cfg.retry_after_s),
            )
        if plan.reply is not None:
            output_fault = pick_output_fault(cfg, cfg.seed, key, attempt)
            spoil(plan.reply, output_fault, request.path, data, plan.asked)
            if output_fault is not None:
                request[NOTES]["output_fault"] = output_fault
        if background:
            return json_response(self._background.create(data, plan, delay, u_outcome))
        return json_response(plan.build())
