"""Background responses: `queued`, then `in_progress`, then settled, retrievable and cancellable.

A response is `in_progress` after a fifth of its duration and then settles `completed`,
`incomplete` (half the text, reason max_output_tokens) or `failed`, drawn from
incomplete_rate / failed_rate; settling emits the matching response.* webhook.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sluice_local.simulator.answers import answer_for, limit_text, positive_int, responses_prompt, shorten
from sluice_local.simulator.core import Core, Emit
from sluice_local.simulator.plans import Plan, response_object
from sluice_local.simulator.wire import json_response, not_found


@dataclass(slots=True)
class BgResponse:
    id: str
    created_at: float
    t0: float
    t_start: float
    t_done: float
    outcome: str
    data: dict[str, Any]
    text: str
    input_tokens: int
    truncated: bool
    cancelled_at: float | None = None
    settled: bool = False
    timer: asyncio.TimerHandle | None = None


class Background:
    """The background responses and the /v1/responses/{id} routes."""

    def __init__(self, core: Core, emit: Emit) -> None:
        self._core = core
        self._emit = emit
        self.responses: dict[str, BgResponse] = {}

    def reset(self) -> None:
        for resp in self.responses.values():
            if resp.timer:
                resp.timer.cancel()
        self.responses.clear()

    def create(self, data: dict[str, Any], plan: Plan, duration: float, u: float) -> dict[str, Any]:
        """Start a background response lasting `duration`; `u` draws its outcome. Returns it `queued`."""
        cfg = self._core.config
        if u < cfg.failed_rate:
            outcome = "failed"
        elif u < cfg.failed_rate + cfg.incomplete_rate:
            outcome = "incomplete"
        else:
            outcome = "completed"
        prompt = responses_prompt(data)
        text, truncated = limit_text(answer_for(prompt), positive_int(data.get("max_output_tokens")))
        if plan.reply is not None and plan.reply.text is not None:
            text, truncated = plan.reply.text, plan.reply.truncated
        if truncated and outcome == "completed":
            outcome = "incomplete"
        elif outcome == "incomplete":
            text = shorten(text)
        now = self._core.now()
        resp = BgResponse(
            id=self._core.new_id("resp_sim"),
            created_at=time.time(),
            t0=now,
            t_start=now + 0.2 * duration,
            t_done=now + duration,
            outcome=outcome,
            data=data,
            text=text,
            input_tokens=plan.prompt_tokens,
            truncated=truncated,
        )
        resp.timer = asyncio.get_running_loop().call_at(resp.t_done, self._settle, resp)
        self.responses[resp.id] = resp
        return self._describe(resp, now)

    def _status(self, resp: BgResponse, now: float) -> str:
        if resp.cancelled_at is not None:
            return "cancelled"
        if now < resp.t_start:
            return "queued"
        if now < resp.t_done:
            return "in_progress"
        return resp.outcome

    def _describe(self, resp: BgResponse, now: float) -> dict[str, Any]:
        status = self._status(resp, now)
        created = int(resp.created_at)
        text: str | None = resp.text if status in ("completed", "incomplete") else None
        error = None
        if status == "failed":
            error = {"code": "server_error", "message": "The simulated model failed to produce a response."}
        completed_at = None
        if status in ("completed", "incomplete", "failed"):
            completed_at = int(resp.created_at + (resp.t_done - resp.t0))
        elif status == "cancelled" and resp.cancelled_at is not None:
            completed_at = int(resp.created_at + (resp.cancelled_at - resp.t0))
        return response_object(
            resp.id, created, status, resp.data, text, resp.input_tokens, error=error, completed_at=completed_at
        )

    def _settle(self, resp: BgResponse) -> None:
        if resp.settled:
            return
        resp.settled = True
        resp.timer = None
        self._emit(f"response.{self._status(resp, max(self._core.now(), resp.t_done))}", resp.id)

    def _get(self, request: web.Request) -> BgResponse:
        resp = self.responses.get(request.match_info["id"])
        if resp is None:
            raise not_found("response", request.match_info["id"])
        return resp

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        return json_response(self._describe(self._get(request), self._core.now()))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        resp = self._get(request)
        now = self._core.now()
        if self._status(resp, now) in ("queued", "in_progress"):
            resp.cancelled_at = now
            if resp.timer is not None:
                resp.timer.cancel()
                resp.timer = None
            resp.settled = True
            self._emit("response.cancelled", resp.id)
        return json_response(self._describe(resp, now))

    async def delete(self, request: web.Request) -> web.StreamResponse:
        resp = self.responses.pop(request.match_info["id"], None)
        if resp is None:
            raise not_found("response", request.match_info["id"])
        if resp.timer is not None:
            resp.timer.cancel()
        return json_response({"id": resp.id, "object": "response.deleted", "deleted": True})
