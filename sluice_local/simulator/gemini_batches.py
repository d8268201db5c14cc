"""Gemini's Batch API: `POST /v1beta/models/{model}:batchGenerateContent` with `batch.inputConfig`
(inline `requests.requests[]` of `{request, metadata}`, or the `fileName` of an uploaded JSONL file
of `{key, request}` lines), answered with the batch as a long-running Operation named `batches/{id}`;
`GET /v1beta/batches/{id}` polls it, `POST /v1beta/batches/{id}:cancel` cancels it, `DELETE` removes
it, `GET /v1beta/batches` lists them.

A batch is BATCH_STATE_PENDING for a batch_phase_s, RUNNING for another, then ends SUCCEEDED with
every request answered: inline ones as `inlinedResponses.inlinedResponses[]` in the order sent, each
with its metadata; a file's as the JSONL `responsesFile` (`files/{id}`, downloadable) whose lines
carry their key, in any order. The operation's `response` and its metadata's `output` both hold it.
The same bad days as the other families' batches, from the same knobs: a batch drawn to expire
(batch_expire_fraction) ends EXPIRED with batch_expire_done_fraction of its requests answered and the
rest absent; a cancelled one ends CANCELLED a batch_cancel_s later (a phase when 0) with the requests
done by the cancel answered (none with batch_cancel_answers "none", which an expired batch then
answers too); a request drawn under batch_row_error_rate is answered with an INTERNAL status, and
one generateContent would refuse with its INVALID_ARGUMENT; batch_validation_error, or a file line
that is not a request, ends the batch FAILED. An inline body over `gemini_inline_limit` (20 MB) is
refused 400, and batch_queue_limit holds the input tokens a model's unfinished batches may have
enqueued: a batch that would pass it is refused 429 RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from sluice_local.simulator import gemini
from sluice_local.simulator.batches import row_tokens
from sluice_local.simulator.core import Core
from sluice_local.simulator.faults import draws
from sluice_local.simulator.gemini_files import GeminiFiles
from sluice_local.simulator.plans import Plan
from sluice_local.simulator.requestlog import NOTES
from sluice_local.simulator.structured import pick_output_fault, spoil
from sluice_local.simulator.wire import ApiError, json_response, jsonl_lines, read_json, rfc3339

BATCH_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatch"
OUTPUT_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1beta.GenerateContentBatchOutput"
_BATCH_FIELDS = frozenset(
    {
        "model",
        "name",
        "displayName",
        "inputConfig",
        "output",
        "createTime",
        "endTime",
        "updateTime",
        "batchStats",
        "state",
        "priority",
    }
)
_ENDED = frozenset({"BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED", "BATCH_STATE_EXPIRED"})


@dataclass(slots=True)
class Row:
    key: str | None  # a file line's key
    metadata: Any  # an inline request's metadata
    u_done: float
    plan: Plan | None = None
    error: dict[str, Any] | None = None  # the google.rpc.Status it is answered with


@dataclass(slots=True)
class GeminiBatch:
    id: str
    model: str
    display_name: str
    priority: int
    created: float  # wall clock
    t0: float  # the loop's clock
    phase_s: float
    rows: list[Row]
    inline: bool
    outcome: str  # "BATCH_STATE_SUCCEEDED" | "BATCH_STATE_EXPIRED" | "BATCH_STATE_FAILED"
    failure: dict[str, Any] | None
    done_fraction: float
    shuffle_seed: str
    tokens: int
    cancel_t: float | None = None
    output: dict[str, Any] | None = None
    ended: bool = False
    counts: tuple[int, int] = (0, 0)


class GeminiBatches:
    """The batches and the /v1beta/batches routes; a file's batch writes its responses to `files`."""

    def __init__(self, core: Core, files: GeminiFiles) -> None:
        self._core = core
        self._files = files
        self.batches: dict[str, GeminiBatch] = {}

    def reset(self) -> None:
        self.batches.clear()

    def routes(self, app: web.Application, version: str) -> None:
        """The routes under `version`; under v1 those OpenAI's Batch API has too are the app's to share."""
        if version != "v1":
            app.router.add_get(f"/{version}/batches", self.list_batches)
            app.router.add_get(f"/{version}/batches/{{id}}", self.retrieve)
        app.router.add_post(f"/{version}/batches/{{id}}", self.cancel)
        app.router.add_delete(f"/{version}/batches/{{id}}", self.delete)

    def enqueued(self, model: str, now: float) -> int:
        """Input tokens the model's unfinished batches hold in its queue."""
        return sum(b.tokens for b in self.batches.values() if b.model == model and self._state(b, now) not in _ENDED)

    async def create(self, request: web.Request) -> web.StreamResponse:
        raw, data = await read_json(request)
        model = gemini.split_spec(request.match_info["spec"])[0]
        batch = data.get("batch")
        if not isinstance(batch, dict):
            raise ApiError(400, "* BatchGenerateContentRequest.batch: batch is required")
        for name in batch:
            if gemini.camel(name) not in _BATCH_FIELDS:
                raise ApiError(400, f'Invalid JSON payload received. Unknown name "batch.{name}": Cannot find field.')
        config = gemini.field(batch, "inputConfig")
        if not isinstance(config, dict):
            raise ApiError(400, "* BatchGenerateContentRequest.batch.input_config: input_config is required")
        inline = gemini.field(config, "requests")
        file_name = gemini.field(config, "fileName")
        if (inline is None) == (file_name is None):
            raise ApiError(400, "* batch.input_config: exactly one of requests and file_name must be set")
        cfg = self._core.config
        failure: dict[str, Any] | None = None
        if inline is not None:
            items = inline.get("requests") if isinstance(inline, dict) else None
            if not isinstance(items, list) or not items:
                raise ApiError(400, "* batch.input_config.requests.requests: at least one request is required")
            lines: list[tuple[str | None, Any]] = [(None, item) for item in items]
            content = raw
        else:
            content = self._files.get(str(file_name)).content
            lines, failure = _file_lines(content)
        if cfg.batch_validation_error:
            failure = {"code": 3, "message": "Simulated validation failure."}
        rows = [self._row(model, index, key, item) for index, (key, item) in enumerate(lines)]
        tokens = sum(row_tokens(item.get("request") or {}) for _, item in lines if isinstance(item, dict))
        now = self._core.now()
        limit = cfg.batch_queue_limit
        if limit and failure is None and self.enqueued(model, now) + tokens > limit:
            raise ApiError(
                429,
                f"Enqueued token limit reached for models/{model}: {limit:,} input tokens may be enqueued at once "
                "(simulated). Try again once some running batches have finished.",
            )
        digest = hashlib.blake2b(content, digest_size=16).hexdigest()
        outcome = "BATCH_STATE_FAILED" if failure is not None else "BATCH_STATE_SUCCEEDED"
        if outcome == "BATCH_STATE_SUCCEEDED" and draws(cfg.seed, f"gbatch:{digest}", 0)[0] < cfg.batch_expire_fraction:
            outcome = "BATCH_STATE_EXPIRED"
        priority = gemini.field(batch, "priority")
        created = GeminiBatch(
            id=self._core.new_id("").lower(),
            model=model,
            display_name=str(gemini.field(batch, "displayName") or ""),
            priority=int(priority) if isinstance(priority, (int, str)) and str(priority).lstrip("-").isdigit() else 0,
            created=time.time(),
            t0=now,
            phase_s=cfg.batch_phase_s,
            rows=rows,
            inline=inline is not None,
            outcome=outcome,
            failure=failure,
            done_fraction=cfg.expired_done if outcome == "BATCH_STATE_EXPIRED" else 1.0,
            shuffle_seed=f"{cfg.seed}:{digest}",
            tokens=0 if failure is not None else tokens,
        )
        self.batches[created.id] = created
        request[NOTES]["batch_id"] = f"batches/{created.id}"
        return json_response(self._describe(created))

    def _row(self, model: str, index: int, key: str | None, item: Any) -> Row:
        """One request of a batch, planned and given its draws; a line of a file that is not a
        request is a row without a plan (the batch has failed)."""
        cfg = self._core.config
        body = item.get("request") if isinstance(item, dict) else None
        metadata = item.get("metadata") if isinstance(item, dict) and key is None else None
        if key is None and not isinstance(body, dict):
            raise ApiError(400, f"* batch.input_config.requests.requests[{index}].request: request is required")
        named = key if key is not None else _metadata_key(metadata)
        row_key = f"gbatchrow:{named}" if named is not None else f"gbatchrow:{index}:{orjson.dumps(body).hex()[:32]}"
        attempt = self._core.next_attempt(row_key)
        u_done, u_error, _ = draws(cfg.seed, row_key, attempt)
        row = Row(key, metadata, u_done)
        if not isinstance(body, dict):
            return row
        try:
            row.plan = gemini.plan_gemini(model, body, self._core.new_id)
        except ApiError as err:
            row.error = gemini.rpc_status(err)
            return row
        if row.plan.reply is not None:
            fault = pick_output_fault(cfg, cfg.seed, row_key, attempt)
            spoil(row.plan.reply, fault, "generateContent", body, row.plan.asked)
        if u_error < cfg.batch_row_error_rate:
            row.plan, row.error = None, {"code": 13, "message": "Internal error encountered (simulated fault)."}
        return row

    def _state(self, batch: GeminiBatch, now: float) -> str:
        p = batch.phase_s
        if batch.cancel_t is not None and now >= batch.cancel_t + self._cancel_s(batch):
            return "BATCH_STATE_CANCELLED"
        if now < batch.t0 + p:
            return "BATCH_STATE_PENDING"
        if batch.outcome == "BATCH_STATE_FAILED":
            return "BATCH_STATE_FAILED"
        if now < batch.t0 + 2 * p or batch.cancel_t is not None:
            return "BATCH_STATE_RUNNING"
        return batch.outcome

    def _cancel_s(self, batch: GeminiBatch) -> float:
        return self._core.config.batch_cancel_s or batch.phase_s

    def _end(self, batch: GeminiBatch, state: str) -> None:
        """Write the output of a batch that has just ended."""
        if batch.ended:
            return
        batch.ended = True
        if state == "BATCH_STATE_FAILED":
            return
        done = batch.done_fraction
        if state == "BATCH_STATE_CANCELLED" and batch.cancel_t is not None:
            p = batch.phase_s
            elapsed = 1.0 if p <= 0 else (batch.cancel_t - batch.t0) / (2 * p)
            progress = 1.0 if p <= 0 else (batch.cancel_t - batch.t0 - p) / p
            done = self._core.config.done_when_cancelled(elapsed, progress)
        answered = [row for row in batch.rows if done >= 1.0 or row.u_done < done]
        ok = sum(1 for row in answered if row.plan is not None)
        batch.counts = (ok, len(answered) - ok)
        if not answered:
            return
        if batch.inline:
            items = [{**_result(row), "metadata": row.metadata} for row in answered]
            batch.output = {"inlinedResponses": {"inlinedResponses": items}}
            return
        lines = [orjson.dumps({"key": row.key, **_result(row)}) for row in answered]
        random.Random(batch.shuffle_seed).shuffle(lines)
        stored = self._files.store(
            f"batch-{batch.id}-responses", "application/jsonl", b"\n".join(lines) + b"\n", "GENERATED"
        )
        batch.output = {"responsesFile": f"files/{stored.id}"}

    def _describe(self, batch: GeminiBatch) -> dict[str, Any]:
        now = self._core.now()
        state = self._state(batch, now)
        total = len(batch.rows)
        if state in _ENDED:
            self._end(batch, state)
        ok, failed = batch.counts
        meta: dict[str, Any] = {
            "@type": BATCH_TYPE,
            "model": f"models/{batch.model}",
            "displayName": batch.display_name,
            "createTime": rfc3339(batch.created),
            "updateTime": rfc3339(batch.created + max(0.0, now - batch.t0)),
            "batchStats": {
                "requestCount": str(total),
                "successfulRequestCount": str(ok),
                "failedRequestCount": str(failed),
                "pendingRequestCount": str(total - ok - failed),
            },
            "state": state,
            "name": f"batches/{batch.id}",
        }
        if batch.priority:
            meta["priority"] = str(batch.priority)
        operation: dict[str, Any] = {"name": f"batches/{batch.id}", "metadata": meta}
        if state not in _ENDED:
            return operation
        p = batch.phase_s
        end = (
            batch.cancel_t + self._cancel_s(batch)
            if state == "BATCH_STATE_CANCELLED" and batch.cancel_t is not None
            else None
        )
        end = end if end is not None else batch.t0 + (p if state == "BATCH_STATE_FAILED" else 2 * p)
        meta["endTime"] = rfc3339(batch.created + (end - batch.t0))
        operation["done"] = True
        if state == "BATCH_STATE_FAILED":
            operation["error"] = batch.failure
        elif batch.output is not None:
            meta["output"] = batch.output
            operation["response"] = {"@type": OUTPUT_TYPE, **batch.output}
        return operation

    def _get(self, request: web.Request) -> GeminiBatch:
        ident = request.match_info["id"].partition(":")[0]
        batch = self.batches.get(ident)
        if batch is None:
            raise ApiError(404, f"Batch batches/{ident} not found.")
        return batch

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        return json_response(self._describe(self._get(request)))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        if not request.match_info["id"].endswith(":cancel"):
            raise ApiError(404, f"Method not found: POST {request.path}")
        batch = self._get(request)
        now = self._core.now()
        if batch.cancel_t is None and self._state(batch, now) not in _ENDED:
            batch.cancel_t = now
        return json_response({})

    async def delete(self, request: web.Request) -> web.StreamResponse:
        del self.batches[self._get(request).id]
        return json_response({})

    async def list_batches(self, request: web.Request) -> web.StreamResponse:
        try:
            size = min(max(int(request.query.get("pageSize", "50")), 1), 1000)
            start = int(request.query.get("pageToken") or 0)
        except ValueError:
            raise ApiError(400, "pageSize and pageToken must be integers.") from None
        ordered = list(reversed(self.batches.values()))
        page = [self._describe(batch) for batch in ordered[start : start + size]]
        answer: dict[str, Any] = {"operations": page}
        if start + size < len(ordered):
            answer["nextPageToken"] = str(start + size)
        return json_response(answer)


def _metadata_key(metadata: Any) -> str | None:
    key = metadata.get("key") if isinstance(metadata, dict) else None
    return str(key) if key is not None else None


def _result(row: Row) -> dict[str, Any]:
    if row.plan is not None:
        return {"response": row.plan.build()}
    return {"error": row.error or {"code": 3, "message": "The line is not a request."}}


def _file_lines(content: bytes) -> tuple[list[tuple[str | None, Any]], dict[str, Any] | None]:
    """The `{key, request}` lines of an input file, and the status that fails the batch when one is
    not a request (or the file holds none)."""
    lines: list[tuple[str | None, Any]] = []
    failure: dict[str, Any] | None = None
    for number, _, item in jsonl_lines(content):
        if not isinstance(item, dict) or not isinstance(item.get("request"), dict):
            failure = failure or {"code": 3, "message": f"Line {number} of the input file is not a request."}
            lines.append((str(number), None))
            continue
        key = item.get("key")
        lines.append((str(key) if key is not None else str(number), item))
    if not lines:
        failure = {"code": 3, "message": "The input file holds no requests."}
    return lines, failure
