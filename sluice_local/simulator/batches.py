"""The Batch API: batches move validating -> in_progress -> finalizing -> completed.

Each phase lasts batch_phase_s. A batch `expired` (chance batch_expire_fraction, drawn from
the seed and the input file) keeps batch_expire_done_fraction of its rows in the output
file; the rest go to the error file with code `batch_expired` (`batch_cancelled` when
cancelled). A cancelled batch keeps what it had finished by the cancel, or nothing
(batch_cancel_answers). Output lines are shuffled, as real providers do.

The queue limit (batch_queue_limit) is OpenAI's per-model Batch queue limit: the input tokens
of a model's batches still validating, in progress, finalizing or cancelling may not pass it,
and a batch that would take them over fails validation with `token_limit_exceeded` (no line
number, nothing run); its tokens never count. A row's tokens are its body's compact JSON bytes
divided by four, rounded up, a common rule of thumb for English: OpenAI counts the prompt
with its tokenizer, which a simulator has no need to copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from sluice_local.simulator.core import Core, Emit
from sluice_local.simulator.faults import draws
from sluice_local.simulator.files import Files
from sluice_local.simulator.plans import BATCH_ENDPOINTS, Plan, plan_for
from sluice_local.simulator.requestlog import NOTES
from sluice_local.simulator.structured import pick_output_fault, spoil
from sluice_local.simulator.wire import ApiError, json_response, jsonl_lines, not_found, read_json

QUEUED_STATUSES = frozenset({"validating", "in_progress", "finalizing", "cancelling"})


def row_tokens(body: dict[str, Any]) -> int:
    """Input tokens a row holds in the Batch queue (see the module's docstring)."""
    return max(1, -(-len(orjson.dumps(body)) // 4))


@dataclass(slots=True)
class Row:
    line: int
    custom_id: str
    u_done: float
    plan: Plan | None = None
    error_status: int | None = None  # 400 for an unusable body, 500 for an injected row error
    error_body: dict[str, Any] | None = None
    tokens: int = 0
    model: str | None = None


@dataclass(slots=True)
class Batch:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None
    created_at: int
    t0: float
    phase_s: float
    plan: str  # "completed" | "expired" | "failed"
    rows: list[Row]
    errors: list[dict[str, Any]]
    shuffle_seed: str
    done_fraction: float = 1.0
    cancel_t: float | None = None
    finished: bool = False
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: tuple[int, int] = (0, 0)
    usage: dict[str, int] = field(default_factory=dict)
    timer: asyncio.TimerHandle | None = None
    model: str | None = None
    tokens: int = 0  # what the batch holds in its model's queue while it runs


class Batches:
    """The batches and the /v1/batches routes; finished batches write their files to `files`."""

    def __init__(self, core: Core, files: Files, emit: Emit) -> None:
        self._core = core
        self._files = files
        self._emit = emit
        self.batches: dict[str, Batch] = {}
        # the most input tokens a model's queue held at once, and the batches refused for a full queue
        self.peak_enqueued: dict[str, int] = {}
        self.limit_refusals = 0

    def reset(self) -> None:
        for batch in self.batches.values():
            if batch.timer:
                batch.timer.cancel()
        self.batches.clear()
        self.peak_enqueued.clear()
        self.limit_refusals = 0

    def enqueued(self, model: str | None, now: float) -> int:
        """Input tokens the model's running batches hold in the queue at `now`."""
        return sum(
            b.tokens
            for b in self.batches.values()
            if b.model == model and b.plan != "failed" and self._status(b, now) in QUEUED_STATUSES
        )

    async def create(self, request: web.Request) -> web.StreamResponse:
        _, data = await read_json(request)
        input_file_id, endpoint, window, metadata = self._fields(data)
        cfg = self._core.config
        content = self._files.files[input_file_id].content
        digest = hashlib.blake2b(content, digest_size=16).hexdigest()
        rows, errors = self._parse(content, str(endpoint))
        if cfg.batch_validation_error:
            errors.append(
                {
                    "code": "simulated_validation_error",
                    "message": "Simulated validation failure.",
                    "param": None,
                    "line": 1,
                }
            )
        now = self._core.now()
        model = next((row.model for row in rows if row.model), None)
        tokens = sum(row.tokens for row in rows)
        if not errors:
            errors.extend(self._enqueue(model, tokens, now))
        if errors:
            outcome = "failed"
        elif draws(cfg.seed, f"batch:{digest}", 0)[0] < cfg.batch_expire_fraction:
            outcome = "expired"
        else:
            outcome = "completed"
        batch = Batch(
            id=self._core.new_id("batch_sim"),
            input_file_id=input_file_id,
            endpoint=str(endpoint),
            completion_window=window,
            metadata=metadata,
            created_at=int(time.time()),
            t0=now,
            phase_s=cfg.batch_phase_s,
            plan=outcome,
            rows=rows,
            errors=errors,
            shuffle_seed=f"{cfg.seed}:{digest}",
            done_fraction=cfg.expired_done if outcome == "expired" else 1.0,
            model=model,
            tokens=tokens,
        )
        end = now + (1 if outcome == "failed" else 3) * batch.phase_s
        batch.timer = asyncio.get_running_loop().call_at(end, self._refresh, batch)
        self.batches[batch.id] = batch
        request[NOTES]["batch_id"] = batch.id
        return json_response(self._describe(batch, now))

    def _fields(self, data: dict[str, Any]) -> tuple[str, str, str, dict[str, Any] | None]:
        """The request's file, endpoint, window and metadata, refused as the Batch API refuses
        them before it reads the file."""
        input_file_id = data.get("input_file_id")
        endpoint = data.get("endpoint")
        window = data.get("completion_window")
        metadata = data.get("metadata")
        if not isinstance(input_file_id, str) or input_file_id not in self._files.files:
            raise ApiError(
                400, f"Invalid 'input_file_id': {input_file_id!r}.", param="input_file_id", code="invalid_value"
            )
        if endpoint not in BATCH_ENDPOINTS:
            raise ApiError(400, f"Invalid 'endpoint': {endpoint!r}.", param="endpoint", code="invalid_value")
        if not isinstance(window, str) or not window:
            raise ApiError(
                400, "Missing 'completion_window'.", param="completion_window", code="missing_required_parameter"
            )
        if metadata is not None and not isinstance(metadata, dict):
            raise ApiError(400, "'metadata' must be an object.", param="metadata", code="invalid_value")
        return input_file_id, str(endpoint), window, metadata

    def _enqueue(self, model: str | None, tokens: int, now: float) -> list[dict[str, Any]]:
        """The model's enqueued-token limit: the batch's tokens counted in the queue's peak, or the
        error that fails the batch when they would pass the limit."""
        held = self.enqueued(model, now)
        limit = self._core.config.batch_queue_limit
        if limit and held + tokens > limit:
            self.limit_refusals += 1
            return [
                {
                    "code": "token_limit_exceeded",
                    "message": (
                        f"Enqueued token limit reached for {model} in organization org-simulator. "
                        f"Limit: {limit:,} enqueued tokens. "
                        "Please try again once some in_progress batches have been completed."
                    ),
                    "param": None,
                    "line": None,
                }
            ]
        self.peak_enqueued[model or ""] = max(self.peak_enqueued.get(model or "", 0), held + tokens)
        return []

    def _parse(self, content: bytes, endpoint: str) -> tuple[list[Row], list[dict[str, Any]]]:
        cfg = self._core.config
        rows: list[Row] = []
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()

        def bad(line: int, code: str, message: str, param: str | None = None) -> None:
            errors.append({"code": code, "message": message, "param": param, "line": line})

        for number, parsed, item in jsonl_lines(content):
            if not parsed:
                bad(number, "invalid_json_line", "This line is not parseable as valid JSON.")
                continue
            if not isinstance(item, dict):
                bad(number, "invalid_json_line", "Each line must be a JSON object.")
                continue
            custom_id = item.get("custom_id")
            body = item.get("body")
            if not isinstance(custom_id, str) or not custom_id:
                bad(number, "missing_required_parameter", "Missing 'custom_id'.", "custom_id")
            elif custom_id in seen:
                bad(number, "duplicate_custom_id", f"The custom_id '{custom_id}' is used more than once.", "custom_id")
            elif item.get("method") != "POST":
                bad(number, "invalid_method", "Only POST is supported.", "method")
            elif item.get("url") != endpoint:
                bad(number, "mismatched_endpoint", f"The url must match the batch endpoint {endpoint}.", "url")
            elif not isinstance(body, dict):
                bad(number, "missing_required_parameter", "Missing 'body'.", "body")
            else:
                seen.add(custom_id)
                # counted per custom id so a row resubmitted in a later batch gets a fresh draw
                row_key = f"batchrow:{custom_id}"
                attempt = self._core.next_attempt(row_key)
                u_done, u_error, _ = draws(cfg.seed, row_key, attempt)
                model = body.get("model")
                row = Row(
                    number, custom_id, u_done, tokens=row_tokens(body), model=model if isinstance(model, str) else None
                )
                try:
                    row.plan = plan_for(endpoint, body, self._core.new_id, cfg.embedding_dims)
                except ApiError as err:
                    row.error_status, row.error_body = err.status, err.body
                if row.plan is not None and row.plan.reply is not None:
                    spoil(row.plan.reply, pick_output_fault(cfg, cfg.seed, row_key, attempt), endpoint, body)
                if row.plan is not None and u_error < cfg.batch_row_error_rate:
                    failure = ApiError(
                        500, "The server had an error processing this request (simulated fault).", type="server_error"
                    )
                    row.error_status, row.error_body = failure.status, failure.body
                rows.append(row)
        if not rows and not errors:
            bad(0, "empty_file", "The input file contains no requests.")
        return rows, errors

    def _status(self, batch: Batch, now: float) -> str:
        p = batch.phase_s
        if batch.cancel_t is not None:
            return "cancelled" if now >= batch.cancel_t + self._cancel_s(batch) else "cancelling"
        if now < batch.t0 + p:
            return "validating"
        if batch.plan == "failed":
            return "failed"
        if now < batch.t0 + 2 * p:
            return "in_progress"
        if now < batch.t0 + 3 * p:
            return "in_progress" if batch.plan == "expired" else "finalizing"
        return batch.plan

    def _cancel_s(self, batch: Batch) -> float:
        return self._core.config.batch_cancel_s or batch.phase_s

    def _progress(self, batch: Batch, now: float) -> float:
        p = batch.phase_s
        if p <= 0:
            return 1.0
        return min(1.0, max(0.0, (now - batch.t0 - p) / p))

    def _refresh(self, batch: Batch) -> None:
        now = self._core.now()
        status = self._status(batch, now)
        if batch.finished or status not in ("completed", "expired", "cancelled", "failed"):
            return
        batch.finished = True
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if status != "failed":
            self._write_batch_files(batch, status)
        self._emit(f"batch.{status}", batch.id)

    def _write_batch_files(self, batch: Batch, status: str) -> None:
        if status == "cancelled" and batch.cancel_t is not None:
            elapsed = (batch.cancel_t - batch.t0) / (3 * batch.phase_s) if batch.phase_s > 0 else 1.0
            done_fraction = self._core.config.done_when_cancelled(elapsed, self._progress(batch, batch.cancel_t))
        else:
            done_fraction = batch.done_fraction
        leftover_code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(status, "")
        ok_lines: list[bytes] = []
        error_lines: list[bytes] = []
        usage = {"input_tokens": 0, "output_tokens": 0}
        for row in batch.rows:
            row_id = self._core.new_id("batch_req_sim")
            if done_fraction < 1.0 and row.u_done >= done_fraction:
                error_lines.append(
                    orjson.dumps(
                        {
                            "id": row_id,
                            "custom_id": row.custom_id,
                            "response": None,
                            "error": {
                                "code": leftover_code,
                                "message": f"The request was not executed before the batch was {status}.",
                            },
                        }
                    )
                )
                continue
            request_id = self._core.new_id("req_")
            if row.plan is None or row.error_status is not None:
                error_lines.append(
                    orjson.dumps(
                        {
                            "id": row_id,
                            "custom_id": row.custom_id,
                            "response": {
                                "status_code": row.error_status,
                                "request_id": request_id,
                                "body": row.error_body,
                            },
                            "error": None,
                        }
                    )
                )
                continue
            answer = row.plan
            usage["input_tokens"] += answer.prompt_tokens
            usage["output_tokens"] += answer.completion_tokens
            ok_lines.append(
                orjson.dumps(
                    {
                        "id": row_id,
                        "custom_id": row.custom_id,
                        "response": {"status_code": 200, "request_id": request_id, "body": answer.build()},
                        "error": None,
                    }
                )
            )
        shuffler = random.Random(batch.shuffle_seed)
        shuffler.shuffle(ok_lines)
        shuffler.shuffle(error_lines)
        if ok_lines:
            out = self._files.store(f"{batch.id}_output.jsonl", "batch_output", b"\n".join(ok_lines) + b"\n")
            batch.output_file_id = out.id
        if error_lines:
            err = self._files.store(f"{batch.id}_error.jsonl", "batch_output", b"\n".join(error_lines) + b"\n")
            batch.error_file_id = err.id
        batch.counts = (len(ok_lines), len(error_lines))
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        batch.usage = usage

    def _describe(self, batch: Batch, now: float) -> dict[str, Any]:
        status = self._status(batch, now)
        p = batch.phase_s

        def at(offset: float) -> int:
            return int(batch.created_at + offset)

        def when(reached: bool, offset: float) -> int | None:
            return at(offset) if reached else None

        total = len(batch.rows)
        if batch.finished:
            completed, failed = batch.counts
        elif status in ("validating", "failed"):
            total, completed, failed = (0, 0, 0)
        else:
            progress = self._progress(batch, now if batch.cancel_t is None else batch.cancel_t)
            ok = sum(1 for r in batch.rows if r.error_status is None)
            completed = int(ok * progress)
            failed = int((total - ok) * progress)
        passed_validation = status not in ("validating", "failed")
        in_progress_at = when(passed_validation and (batch.cancel_t is None or batch.cancel_t >= batch.t0 + p), p)
        cancel_off = None if batch.cancel_t is None else batch.cancel_t - batch.t0
        usage = None
        if batch.usage:
            usage = {
                **batch.usage,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            }
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "model": batch.model,
            "errors": {"object": "list", "data": batch.errors} if status == "failed" else None,
            "input_file_id": batch.input_file_id,
            "completion_window": batch.completion_window,
            "status": status,
            "output_file_id": batch.output_file_id,
            "error_file_id": batch.error_file_id,
            "created_at": batch.created_at,
            "in_progress_at": in_progress_at,
            "expires_at": batch.created_at + 86_400,
            "finalizing_at": when(status in ("finalizing", "completed"), 2 * p),
            "completed_at": when(status == "completed", 3 * p),
            "failed_at": when(status == "failed", p),
            "expired_at": when(status == "expired", 3 * p),
            "cancelling_at": when(cancel_off is not None, cancel_off or 0.0),
            "cancelled_at": when(status == "cancelled", (cancel_off or 0.0) + self._cancel_s(batch)),
            "request_counts": {"total": total, "completed": completed, "failed": failed},
            "metadata": batch.metadata,
            "usage": usage,
        }

    def _get(self, ident: str) -> Batch:
        batch = self.batches.get(ident)
        if batch is None:
            raise not_found("batch", ident)
        self._refresh(batch)
        return batch

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        return json_response(self._describe(self._get(request.match_info["id"]), self._core.now()))

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        batch = self._get(request.match_info["id"])
        now = self._core.now()
        if self._status(batch, now) in ("validating", "in_progress", "finalizing"):
            batch.cancel_t = now
            if batch.timer is not None:
                batch.timer.cancel()
            batch.timer = asyncio.get_running_loop().call_at(now + self._cancel_s(batch), self._refresh, batch)
        return json_response(self._describe(batch, now))

    async def list_batches(self, request: web.Request) -> web.StreamResponse:
        try:
            limit = min(max(int(request.query.get("limit", "20")), 1), 100)
        except ValueError:
            raise ApiError(400, "'limit' must be an integer.", param="limit", code="invalid_value") from None
        ordered = list(reversed(self.batches.values()))
        after = request.query.get("after")
        if after:
            ids = [b.id for b in ordered]
            start = ids.index(after) + 1 if after in ids else len(ids)
            ordered = ordered[start:]
        page = ordered[:limit]
        now = self._core.now()
        data = []
        for batch in page:
            self._refresh(batch)
            data.append(self._describe(batch, now))
        return json_response(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(ordered) > limit,
            }
        )
