"""Anthropic's Message Batches: `POST /v1/messages/batches` with inline requests, retrieve, list
(newest first, paged by `after_id`), cancel, delete, and the results as JSONL in any order.

A batch is `in_progress` for two batch_phase_s, then `ended`. The same knobs as the Batch API's
where they apply: a batch drawn to expire (batch_expire_fraction, from the seed and its requests)
ends with batch_expire_done_fraction of its requests answered and the rest `expired`; a request
drawn under batch_row_error_rate is `errored` with an api_error, as is one whose params
/v1/messages would refuse (invalid_request_error). A cancel ends the batch one phase later with
the requests done by then answered (none with batch_cancel_answers "none") and the rest
`canceled`. Each request is answered as
/v1/messages answers it. batch_queue_limit holds the input tokens of the batches in progress (a
row's tokens counted as the Batch API's are): a batch that would pass it is refused with a 429
`rate_limit_error`, as Anthropic refuses a batch when its processing queue is full.
"""

from __future__ import annotations

import hashlib
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from sluice_local.simulator.batches import row_tokens
from sluice_local.simulator.core import Core
from sluice_local.simulator.faults import draws
from sluice_local.simulator.messages import MESSAGES_PATH, plan_messages
from sluice_local.simulator.plans import Plan
from sluice_local.simulator.requestlog import NOTES
from sluice_local.simulator.structured import pick_output_fault, spoil
from sluice_local.simulator.wire import ApiError, json_response, read_json, rfc3339

BATCHES_PATH = "/v1/messages/batches"
MAX_REQUESTS = 100_000
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_EXPIRES_S = 86_400


@dataclass(slots=True)
class Request:
    custom_id: str
    u_done: float
    plan: Plan | None = None
    error: dict[str, Any] | None = None  # the `error` of an errored result


@dataclass(slots=True)
class MessageBatch:
    id: str
    created_at: float  # wall clock
    t0: float  # the loop's clock
    phase_s: float
    requests: list[Request]
    expire: bool
    done_fraction: float
    shuffle_seed: str
    cancel_t: float | None = None
    cancel_at: float | None = None  # wall clock
    results: bytes | None = None
    counts: dict[str, int] = field(default_factory=dict)
    tokens: int = 0


class MessageBatches:
    """The batches and the /v1/messages/batches routes."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self.batches: dict[str, MessageBatch] = {}
        self.deleted: list[str] = []

    def reset(self) -> None:
        self.batches.clear()
        self.deleted.clear()

    def enqueued(self) -> int:
        """Input tokens the batches still in progress hold in the queue."""
        now = self._core.now()
        return sum(b.tokens for b in self.batches.values() if not self._ended(b, now))

    def routes(self, app: web.Application) -> None:
        app.router.add_post(BATCHES_PATH, self.create)
        app.router.add_get(BATCHES_PATH, self.list_batches)
        app.router.add_get(BATCHES_PATH + "/{id}", self.retrieve)
        app.router.add_delete(BATCHES_PATH + "/{id}", self.delete)
        app.router.add_post(BATCHES_PATH + "/{id}/cancel", self.cancel)
        app.router.add_get(BATCHES_PATH + "/{id}/results", self.results)

    async def create(self, request: web.Request) -> web.StreamResponse:
        raw, data = await read_json(request)
        items = data.get("requests")
        if not isinstance(items, list) or not 1 <= len(items) <= MAX_REQUESTS:
            raise ApiError(400, f"requests: between 1 and {MAX_REQUESTS:,} requests are required")
        cfg = self._core.config
        seen: set[str] = set()
        requests: list[Request] = []
        for index, item in enumerate(items):
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            params = item.get("params") if isinstance(item, dict) else None
            if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
                raise ApiError(400, f"requests.{index}.custom_id: String should match pattern '{CUSTOM_ID.pattern}'")
            if custom_id in seen:
                raise ApiError(400, f"requests.{index}.custom_id: duplicate custom_id {custom_id!r}")
            if not isinstance(params, dict):
                raise ApiError(400, f"requests.{index}.params: Field required")
            seen.add(custom_id)
            key = f"msgbatchrow:{custom_id}"
            attempt = self._core.next_attempt(key)
            u_done, u_error, _ = draws(cfg.seed, key, attempt)
            row = Request(custom_id, u_done)
            try:
                row.plan = plan_messages(params, self._core.new_id)
            except ApiError as err:
                message = err.body.get("error", {}).get("message", str(err))
                row.error = {"type": "invalid_request_error", "message": message}
            if row.plan is not None and row.plan.reply is not None:
                spoil(row.plan.reply, pick_output_fault(cfg, cfg.seed, key, attempt), MESSAGES_PATH, params)
            if row.plan is not None and u_error < cfg.batch_row_error_rate:
                row.plan, row.error = None, {"type": "api_error", "message": "Internal server error (simulated fault)."}
            requests.append(row)
        tokens = sum(row_tokens(item["params"]) for item in items)
        limit = cfg.batch_queue_limit
        if limit and self.enqueued() + tokens > limit:
            raise ApiError(429, f"Message batch queue full: {limit:,} input tokens may be in progress at once.")
        digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
        expire = draws(cfg.seed, f"msgbatch:{digest}", 0)[0] < cfg.batch_expire_fraction
        batch = MessageBatch(
            id=self._core.new_id("msgbatch_sim"),
            created_at=time.time(),
            t0=self._core.now(),
            phase_s=cfg.batch_phase_s,
            requests=requests,
            expire=expire,
            done_fraction=cfg.expired_done if expire else 1.0,
            shuffle_seed=f"{cfg.seed}:{digest}",
            tokens=tokens,
        )
        self.batches[batch.id] = batch
        request[NOTES]["batch_id"] = batch.id
        return json_response(self._describe(request, batch))

    def _ended(self, batch: MessageBatch, now: float) -> bool:
        if batch.cancel_t is not None:
            return now >= batch.cancel_t + batch.phase_s
        return now >= batch.t0 + 2 * batch.phase_s

    def _end(self, batch: MessageBatch) -> None:
        """Write the results of a batch that has just ended."""
        if batch.results is not None:
            return
        if batch.cancel_t is not None:
            p = batch.phase_s
            elapsed = 1.0 if p <= 0 else (batch.cancel_t - batch.t0) / (2 * p)
            done = self._core.config.done_when_cancelled(elapsed, elapsed)
            left = "canceled"
        else:
            done, left = batch.done_fraction, "expired"
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        lines: list[bytes] = []
        for row in batch.requests:
            if done < 1.0 and row.u_done >= done:
                result: dict[str, Any] = {"type": left}
            elif row.plan is not None:
                result = {"type": "succeeded", "message": row.plan.build()}
            else:
                result = {"type": "errored", "error": {"type": "error", "error": row.error}}
            counts[result["type"]] += 1
            lines.append(orjson.dumps({"custom_id": row.custom_id, "result": result}))
        random.Random(batch.shuffle_seed).shuffle(lines)
        batch.results = b"\n".join(lines) + b"\n"
        batch.counts = counts

    def _describe(self, request: web.Request, batch: MessageBatch) -> dict[str, Any]:
        now = self._core.now()
        ended = self._ended(batch, now)
        if ended:
            self._end(batch)
            counts = batch.counts
            status = "ended"
            p = batch.phase_s
            end = batch.cancel_t + p if batch.cancel_t is not None else batch.t0 + 2 * p
            ended_at: str | None = rfc3339(batch.created_at + (end - batch.t0))
            results_url: str | None = f"{BATCHES_PATH}/{batch.id}/results"
            if not self._core.config.relative_results_url:
                results_url = f"{request.url.origin()}{results_url}"
        else:
            counts = {"processing": len(batch.requests), "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
            status = "canceling" if batch.cancel_t is not None else "in_progress"
            ended_at = results_url = None
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": counts,
            "ended_at": ended_at,
            "created_at": rfc3339(batch.created_at),
            "expires_at": rfc3339(batch.created_at + _EXPIRES_S),
            "archived_at": None,
            "cancel_initiated_at": rfc3339(batch.cancel_at) if batch.cancel_at is not None else None,
            "results_url": results_url,
        }

    def _get(self, request: web.Request) -> MessageBatch:
        ident = request.match_info["id"]
        batch = self.batches.get(ident)
        if batch is None:
            raise ApiError(404, f"message batch {ident!r} not found")
        return batch

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        return json_response(self._describe(request, self._get(request)))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        batch = self._get(request)
        now = self._core.now()
        if batch.cancel_t is None and not self._ended(batch, now):
            batch.cancel_t, batch.cancel_at = now, time.time()
        return json_response(self._describe(request, batch))

    async def delete(self, request: web.Request) -> web.StreamResponse:
        batch = self._get(request)
        if not self._ended(batch, self._core.now()):
            raise ApiError(400, f"message batch {batch.id} cannot be deleted while it is processing; cancel it first")
        del self.batches[batch.id]
        self.deleted.append(batch.id)
        return json_response({"id": batch.id, "type": "message_batch_deleted"})

    async def results(self, request: web.Request) -> web.StreamResponse:
        batch = self._get(request)
        if not self._ended(batch, self._core.now()):
            raise ApiError(400, f"message batch {batch.id} has not ended: its results are not ready")
        self._end(batch)
        return web.Response(body=batch.results, content_type="application/binary")

    async def list_batches(self, request: web.Request) -> web.StreamResponse:
        try:
            limit = min(max(int(request.query.get("limit", "20")), 1), 1000)
        except ValueError:
            raise ApiError(400, "limit: Input should be a valid integer") from None
        ordered = list(reversed(self.batches.values()))
        after = request.query.get("after_id")
        if after:
            ids = [b.id for b in ordered]
            ordered = ordered[ids.index(after) + 1 if after in ids else len(ids) :]
        page = [self._describe(request, batch) for batch in ordered[:limit]]
        return json_response(
            {
                "data": page,
                "has_more": len(ordered) > limit,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
            }
        )
