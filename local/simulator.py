"""An OpenAI-compatible provider simulator for the demo, the tests and the benchmarks.

Everything it answers is labelled as coming from a simulator (`server: sluice-simulator`,
`system_fingerprint: fp_sluice_simulator`, "Simulated reply: ..." texts).

Fault model. Every inference POST (chat/completions, completions, responses, embeddings)
has a *key*: the `x-sluice-custom-id` header, else `metadata.custom_id` /
`metadata.sluice_custom_id` in the body, else the path plus a hash of the body bytes.
Each key has an attempt counter (0, 1, 2, ...). The fault for a request is decided by
hashing (seed, key, attempt) into a number u in [0, 1) and laying the fault rates end to
end: u < rate_429 -> 429; then rate_500 -> 500; then rate_drop -> connection closed with
no answer; then rate_slow -> answered after slow_s; then rate_queue_wait ->
`queue_wait_exceeded` (HTTP `queue_wait_status`, 503 by default); else success. The
outcome therefore depends on the seed and on how often that key has been tried, never on
what other requests arrive in between, and a retried request can succeed. Requests
rejected by the RPM/TPM limiter do not advance the attempt counter, so timing-dependent
throttling never shifts the fault sequence of a key. Faults apply to inference POSTs only;
retrieves, files and batch calls always answer.

Background responses answer `queued` at once, are `in_progress` after a fifth of their
duration (latency_s + jitter, or slow_s) and then settle `completed`, `incomplete` (half
the text, `incomplete_details.reason = "max_output_tokens"`) or `failed`, drawn from
incomplete_rate / failed_rate with the same (seed, key, attempt) hash.

Batches move validating -> in_progress -> finalizing -> completed, batch_phase_s per phase.
A batch `expired` (chance batch_expire_fraction, drawn from the seed and the input file)
keeps batch_expire_done_fraction of its rows in the output file; the rest go to the error
file with code `batch_expired` (`batch_cancelled` when cancelled). Output lines are
shuffled, as real providers do.

Webhooks (when webhook_url is set) follow Standard Webhooks and are signed with
webhook_secret. Admin endpoints outside /v1: GET/DELETE /sim/log, GET/DELETE /sim/webhooks,
GET/POST /sim/config (partial update), GET /sim/health, POST /sim/reset.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import itertools
import logging
import math
import random
import re
import secrets
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
import orjson
from aiohttp import web

log = logging.getLogger(__name__)

SERVER_HEADER = "sluice-simulator"
FINGERPRINT = "fp_sluice_simulator"
CUSTOM_ID_HEADER = "x-sluice-custom-id"
BATCH_ENDPOINTS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions")
# Reported in x-ratelimit-* when no limit is configured: large enough that adaptive
# clients never throttle themselves, and still parseable as integers.
UNLIMITED_REQUESTS = 1_000_000
UNLIMITED_TOKENS = 1_000_000_000

FAULT_429 = "429"
FAULT_500 = "500"
FAULT_DROP = "drop"
FAULT_SLOW = "slow"
FAULT_QUEUE_WAIT = "queue_wait"
FAULT_RATE_LIMIT = "rate_limit"  # the RPM/TPM limiter, not an injected fault

_T = TypeVar("_T")
# what a handler learned about a request (fault, attempt, custom id, ...) for the request log
_NOTES = web.RequestKey("sluice_simulator_notes", dict[str, Any])


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings. Frozen: a runtime change swaps in a new object (`updated`)."""

    latency_s: float = 0.05
    jitter_s: float = 0.0  # each answer waits latency_s + u * jitter_s, u from the fault hash
    seed: int = 0
    api_key: str | None = None  # None: any non-empty bearer token is accepted
    rate_429: float = 0.0
    retry_after_s: float = 1.0
    rate_500: float = 0.0
    rate_drop: float = 0.0
    rate_slow: float = 0.0
    slow_s: float = 5.0
    rate_queue_wait: float = 0.0
    queue_wait_status: int = 503
    incomplete_rate: float = 0.0  # background responses only
    failed_rate: float = 0.0  # background responses only
    rpm_limit: int = 0  # 0 = unlimited
    tpm_limit: int = 0  # 0 = unlimited
    embedding_dims: int = 16
    batch_phase_s: float = 0.2
    batch_expire_fraction: float = 0.0  # share of batches that end `expired`
    batch_expire_done_fraction: float = 0.5  # share of an expired batch's rows that finished
    batch_validation_error: bool = False  # every batch fails validation
    batch_row_error_rate: float = 0.0  # rows answered 500 in the error file
    webhook_url: str | None = None
    webhook_secret: str | None = None  # whsec_...; None sends unsigned events
    webhook_drop_rate: float = 0.0
    webhook_duplicate_rate: float = 0.0
    webhook_delay_s: float = 0.0
    # each event waits an extra 0..jitter seconds, decided by the seed: deliveries arrive out of order
    webhook_jitter_s: float = 0.0
    log_limit: int = 1_000_000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (f.name.startswith("rate_") or f.name.endswith(("_rate", "_fraction"))) and not (0.0 <= value <= 1.0):
                raise ValueError(f"{f.name} must be within [0, 1], got {value}")
            if f.name.endswith(("_s", "_limit", "_dims")) and value < 0:
                raise ValueError(f"{f.name} must not be negative, got {value}")
        if self.request_fault_total > 1.0 + 1e-9:
            raise ValueError("rate_429 + rate_500 + rate_drop + rate_slow + rate_queue_wait > 1")
        if self.incomplete_rate + self.failed_rate > 1.0 + 1e-9:
            raise ValueError("incomplete_rate + failed_rate > 1")
        if not 400 <= self.queue_wait_status <= 599:
            raise ValueError(f"queue_wait_status must be an HTTP error status, got {self.queue_wait_status}")
        if self.embedding_dims < 1 or self.log_limit < 1:
            raise ValueError("embedding_dims and log_limit must be positive")

    @property
    def request_fault_total(self) -> float:
        return self.rate_429 + self.rate_500 + self.rate_drop + self.rate_slow + self.rate_queue_wait

    def updated(self, changes: Mapping[str, Any]) -> SimConfig:
        """A copy with `changes` applied; values are checked against the field types."""
        known = {f.name: f for f in dataclasses.fields(self)}
        coerced: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in known:
                raise ValueError(f"unknown config field {name!r}")
            coerced[name] = _coerce(name, getattr(self, name), SimConfig.__dataclass_fields__[name].default, value)
        return dataclasses.replace(self, **coerced)

    def public(self) -> dict[str, Any]:
        """The config as JSON-able data with secrets masked (they must never be echoed)."""
        data = dataclasses.asdict(self)
        for name in ("api_key", "webhook_secret"):
            if data[name]:
                data[name] = "***"
        return data


def _coerce(name: str, current: Any, default: Any, value: Any) -> Any:
    kind = type(default) if default is not None else str
    if value is None:
        if default is None:
            return None
        raise ValueError(f"{name} may not be null")
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(value, str):
        return value
    raise ValueError(f"{name} must be {kind.__name__}, got {value!r} (currently {current!r})")


def _draws(seed: int, key: str, attempt: int) -> tuple[float, float, float]:
    digest = hashlib.blake2b(f"{seed}\x1f{key}\x1f{attempt}".encode(), digest_size=24).digest()
    a, b, c = struct.unpack("<QQQ", digest)
    return a / 2**64, b / 2**64, c / 2**64


def _pick_fault(config: SimConfig, u: float) -> str | None:
    edge = 0.0
    for rate, fault in (
        (config.rate_429, FAULT_429),
        (config.rate_500, FAULT_500),
        (config.rate_drop, FAULT_DROP),
        (config.rate_slow, FAULT_SLOW),
        (config.rate_queue_wait, FAULT_QUEUE_WAIT),
    ):
        edge += rate
        if u < edge:
            return fault
    return None


def decide_fault(config: SimConfig, key: str, attempt: int) -> str | None:
    """The injected fault for the `attempt`-th (0-based) request with this key, or None."""
    return _pick_fault(config, _draws(config.seed, key, attempt)[0])


def body_key(path: str, body: bytes) -> str:
    """The fault key of a request that carries no custom id."""
    return f"{path}:{hashlib.blake2b(body, digest_size=8).hexdigest()}"


def _lexicon(words: str) -> frozenset[str]:
    return frozenset(words.split())


_POSITIVE = _lexicon(
    "good great excellent amazing love loved loves lovely wonderful best fantastic enjoyed "
    "enjoy enjoyable perfect brilliant beautiful awesome superb fun recommend recommended "
    "happy nice outstanding masterpiece delightful favorite favourite liked like pleasant "
    "solid impressive charming gripping moving touching fresh clever funny hilarious "
    "stunning beautifully terrific worth satisfying glad works reliable fast"
)
_NEGATIVE = _lexicon(
    "bad terrible awful worst boring hate hated poor poorly waste wasted horrible "
    "disappointing disappointed disappointment dull stupid mediocre annoying weak broken "
    "useless refund slow ugly mess fails failed lame pointless predictable bland painful "
    "unwatchable forgettable tedious avoid worse garbage junk rubbish cheap flawed "
    "confusing ridiculous sadly unfortunately problem problems defective returned"
)
_NEGATORS = _lexicon("not no never isn't wasn't don't didn't doesn't can't couldn't won't hardly")
_WORD_RE = re.compile(r"[a-z']+")
_SENTIMENT_RE = re.compile(r"positive\s+or\s+negative\s*:", re.IGNORECASE)
_VOCAB = tuple(
    sorted(
        _lexicon(
            "the a simulated answer request provider batch token model river stone light quiet "
            "steady swift careful bright calm plain clear small large early late open simple "
            "gentle final ready useful short measured"
        )
    )
)


def sentiment(text: str) -> str:
    """Answer "positive" or "negative" by a small lexicon; a negator flips the next hit; ties are positive."""
    score = 0
    flip = False
    for word in _WORD_RE.findall(text.lower()):
        if word in _NEGATORS:
            flip = True
            continue
        hit = 1 if word in _POSITIVE else -1 if word in _NEGATIVE else 0
        if hit:
            score += -hit if flip else hit
            flip = False
    return "negative" if score < 0 else "positive"


def answer_for(prompt: str) -> str:
    """The deterministic reply to a prompt."""
    match = _SENTIMENT_RE.search(prompt)
    if match:
        return sentiment(prompt[match.end() :])
    digest = hashlib.blake2b(prompt.encode(), digest_size=16).digest()
    words = [_VOCAB[b % len(_VOCAB)] for b in digest[1 : 7 + digest[0] % 7]]
    return "Simulated reply: " + " ".join(words) + "."


def count_tokens(text: str) -> int:
    """Roughly 1.3 tokens a word, the way English text tokenises."""
    words = len(text.split())
    return round(words * 1.3) if words else 0


def _limit_text(text: str, max_tokens: int | None) -> tuple[str, bool]:
    if max_tokens is None or count_tokens(text) <= max_tokens:
        return text, False
    words = text.split()
    keep = max(0, int(max_tokens / 1.3))
    while keep > 0 and round(keep * 1.3) > max_tokens:
        keep -= 1
    return " ".join(words[:keep]), True


def _shorten(text: str) -> str:
    words = text.split()
    return " ".join(words[: max(1, len(words) // 2)])


def embedding_vector(text: str, dims: int) -> list[float]:
    """A deterministic unit vector for `text`."""
    raw = text.encode()
    values: list[int] = []
    block = 0
    while len(values) < dims:
        digest = hashlib.blake2b(raw, digest_size=64, salt=block.to_bytes(16, "little")).digest()
        values.extend(struct.unpack("<32h", digest))
        block += 1
    vec = [v / 32768.0 for v in values[:dims]]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "\n".join(parts)
    return ""


def _responses_prompt(data: Mapping[str, Any]) -> str:
    pieces: list[str] = []
    instructions = data.get("instructions")
    if isinstance(instructions, str):
        pieces.append(instructions)
    raw = data.get("input")
    if isinstance(raw, str):
        pieces.append(raw)
    elif isinstance(raw, list):
        for item in raw:
            if isinstance(item, str):
                pieces.append(item)
            elif isinstance(item, dict):
                pieces.append(_text_of(item.get("content", item.get("text"))))
    return "\n".join(pieces)


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _fmt_duration(seconds: float) -> str:
    # the Go-duration style OpenAI uses in x-ratelimit-reset-*: "20ms", "1.5s", "6m0s"
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s"


def _retry_headers(seconds: float) -> dict[str, str]:
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(round(seconds * 1000))}


class ApiError(Exception):
    """An OpenAI-shaped error answer."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type, "param": param, "code": code}}
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        return _json(self.body, status=self.status, headers=self.headers)


class _Dropped(Exception):
    pass


def _json(data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, headers=headers, content_type="application/json")


def _not_found(kind: str, ident: str) -> ApiError:
    return ApiError(404, f"No {kind} found with id '{ident}'.", code="not_found")


class _Bucket:
    """A token bucket refilled continuously: `per_minute` capacity, per_minute/60 per second."""

    __slots__ = ("capacity", "level", "rate", "stamp")

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self.stamp = now

    def fill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_s(self, amount: float) -> float:
        need = min(amount, self.capacity) - self.level
        return need / self.rate if need > 0 else 0.0

    def take(self, amount: float) -> None:
        self.level -= min(amount, self.capacity)

    def reset_s(self) -> float:
        return (self.capacity - self.level) / self.rate


@dataclass(slots=True)
class _Plan:
    prompt_tokens: int
    completion_tokens: int
    build: Callable[[], dict[str, Any]]


@dataclass(slots=True)
class _BgResponse:
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


@dataclass(slots=True)
class _File:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


@dataclass(slots=True)
class _Row:
    line: int
    custom_id: str
    u_done: float
    plan: _Plan | None = None
    error_status: int | None = None  # 400 for an unusable body, 500 for an injected row error
    error_body: dict[str, Any] | None = None


@dataclass(slots=True)
class _Batch:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None
    created_at: int
    t0: float
    phase_s: float
    plan: str  # "completed" | "expired" | "failed"
    rows: list[_Row]
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


class Simulator:
    """The state and handlers behind one simulator app. All methods run on its event loop."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.started = time.time()
        self._run = secrets.token_hex(3)
        self._ids = itertools.count(1)
        self.log: deque[dict[str, Any]] = deque(maxlen=config.log_limit)
        self.webhook_log: deque[dict[str, Any]] = deque(maxlen=config.log_limit)
        self.attempts: dict[str, int] = {}
        self.responses: dict[str, _BgResponse] = {}
        self.files: dict[str, _File] = {}
        self.deleted_files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}
        self._rpm: _Bucket | None = None
        self._tpm: _Bucket | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{self._run}{next(self._ids):010x}"

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def update_config(self, changes: Mapping[str, Any]) -> SimConfig:
        config = self.config.updated(changes)
        if config.log_limit != self.config.log_limit:
            self.log = deque(self.log, maxlen=config.log_limit)
            self.webhook_log = deque(self.webhook_log, maxlen=config.log_limit)
        self.config = config
        return config

    def reset(self) -> None:
        for resp in self.responses.values():
            if resp.timer:
                resp.timer.cancel()
        for batch in self.batches.values():
            if batch.timer:
                batch.timer.cancel()
        self.log.clear()
        self.webhook_log.clear()
        self.attempts.clear()
        self.responses.clear()
        self.files.clear()
        self.deleted_files.clear()
        self.batches.clear()
        self._rpm = self._tpm = None

    async def close(self, _app: web.Application | None = None) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _buckets(self, now: float) -> tuple[_Bucket | None, _Bucket | None]:
        cfg = self.config
        if cfg.rpm_limit and (self._rpm is None or self._rpm.capacity != cfg.rpm_limit):
            self._rpm = _Bucket(cfg.rpm_limit, now)
        if cfg.tpm_limit and (self._tpm is None or self._tpm.capacity != cfg.tpm_limit):
            self._tpm = _Bucket(cfg.tpm_limit, now)
        rpm = self._rpm if cfg.rpm_limit else None
        tpm = self._tpm if cfg.tpm_limit else None
        for bucket in (rpm, tpm):
            if bucket is not None:
                bucket.fill(now)
        return rpm, tpm

    def ratelimit_headers(self) -> dict[str, str]:
        rpm, tpm = self._buckets(self.now())
        headers: dict[str, str] = {}
        for suffix, bucket, unlimited in (("requests", rpm, UNLIMITED_REQUESTS), ("tokens", tpm, UNLIMITED_TOKENS)):
            if bucket is None:
                limit, remaining, reset = unlimited, unlimited, "0s"
            else:
                limit, remaining = int(bucket.capacity), max(0, int(bucket.level))
                reset = _fmt_duration(bucket.reset_s())
            headers[f"x-ratelimit-limit-{suffix}"] = str(limit)
            headers[f"x-ratelimit-remaining-{suffix}"] = str(remaining)
            headers[f"x-ratelimit-reset-{suffix}"] = reset
        return headers

    def _admit(self, tokens: int) -> None:
        rpm, tpm = self._buckets(self.now())
        wait_r = rpm.wait_s(1) if rpm else 0.0
        wait_t = tpm.wait_s(tokens) if tpm else 0.0
        if wait_r > 0 or wait_t > 0:
            what = "requests" if wait_r >= wait_t else "tokens"
            raise ApiError(
                429,
                f"Rate limit reached for {what} per minute (simulator limit). Please try again later.",
                type=what,
                code="rate_limit_exceeded",
                headers=_retry_headers(max(wait_r, wait_t)),
            )
        if rpm:
            rpm.take(1)
        if tpm:
            tpm.take(tokens)

    def check_auth(self, request: web.Request) -> None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise ApiError(
                401,
                "You didn't provide an API key. Provide it as a Bearer token in the Authorization header.",
                code="missing_api_key",
            )
        expected = self.config.api_key
        if expected is not None and not secrets.compare_digest(token, expected):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    def record(self, entry: dict[str, Any]) -> None:
        self.log.append(entry)

    async def _read_json(self, request: web.Request) -> tuple[bytes, dict[str, Any]]:
        raw = await request.read()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ApiError(400, "We could not parse the JSON body of your request.", code="invalid_json") from None
        if not isinstance(data, dict):
            raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
        return raw, data

    def _plan(self, path: str, data: dict[str, Any]) -> _Plan:
        model = data.get("model")
        if not isinstance(model, str) or not model:
            raise ApiError(400, "you must provide a model parameter", param="model", code="missing_required_parameter")
        if data.get("stream"):
            raise ApiError(
                400, "The simulator does not support streaming.", param="stream", code="unsupported_parameter"
            )
        if path == "/v1/chat/completions":
            return self._plan_chat(model, data)
        if path == "/v1/completions":
            return self._plan_completions(model, data)
        if path == "/v1/responses":
            return self._plan_responses(model, data)
        return self._plan_embeddings(model, data)

    def _plan_chat(self, model: str, data: dict[str, Any]) -> _Plan:
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty array.", param="messages", code="invalid_value")
        prompt = "\n".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
        limit = _positive_int(data.get("max_completion_tokens"))
        if limit is None:
            limit = _positive_int(data.get("max_tokens"))
        text, truncated = _limit_text(answer_for(prompt), limit)
        n = min(max(_positive_int(data.get("n")) or 1, 1), 16)
        pt, ct = count_tokens(prompt), count_tokens(text) * n

        def build() -> dict[str, Any]:
            choice_reason = "length" if truncated else "stop"
            return {
                "id": self.new_id("chatcmpl-sim"),
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": text, "refusal": None, "annotations": []},
                        "logprobs": None,
                        "finish_reason": choice_reason,
                    }
                    for i in range(n)
                ],
                "usage": {
                    "prompt_tokens": pt,
                    "completion_tokens": ct,
                    "total_tokens": pt + ct,
                    "prompt_tokens_details": {"cached_tokens": 0},
                    "completion_tokens_details": {"reasoning_tokens": 0},
                },
                "system_fingerprint": FINGERPRINT,
                "service_tier": "default",
            }

        return _Plan(pt, ct, build)

    def _plan_completions(self, model: str, data: dict[str, Any]) -> _Plan:
        raw = data.get("prompt")
        if isinstance(raw, str):
            prompts = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
            prompts = list(raw)
        elif isinstance(raw, list) and raw:
            prompts = [str(raw)]  # token arrays: hash their text form
        else:
            raise ApiError(400, "'prompt' is required.", param="prompt", code="missing_required_parameter")
        limit = _positive_int(data.get("max_tokens"))
        limit = 16 if limit is None else limit  # the legacy endpoint's default
        answers = [_limit_text(answer_for(p), limit) for p in prompts]
        pt = sum(count_tokens(p) for p in prompts)
        ct = sum(count_tokens(text) for text, _ in answers)

        def build() -> dict[str, Any]:
            return {
                "id": self.new_id("cmpl-sim"),
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {"text": text, "index": i, "logprobs": None, "finish_reason": "length" if cut else "stop"}
                    for i, (text, cut) in enumerate(answers)
                ],
                "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
                "system_fingerprint": FINGERPRINT,
            }

        return _Plan(pt, ct, build)

    def _plan_responses(self, model: str, data: dict[str, Any]) -> _Plan:
        if "input" not in data:
            raise ApiError(
                400, "Missing required parameter: 'input'.", param="input", code="missing_required_parameter"
            )
        prompt = _responses_prompt(data)
        text, truncated = _limit_text(answer_for(prompt), _positive_int(data.get("max_output_tokens")))
        pt, ct = count_tokens(prompt), count_tokens(text)

        def build() -> dict[str, Any]:
            status = "incomplete" if truncated else "completed"
            return self._response_object(self.new_id("resp_sim"), int(time.time()), status, data, text, pt)

        return _Plan(pt, ct, build)

    def _plan_embeddings(self, model: str, data: dict[str, Any]) -> _Plan:
        raw = data.get("input")
        if isinstance(raw, str):
            texts = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(t, str) for t in raw):
            texts = list(raw)
        elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            texts = [str(raw)]
        elif isinstance(raw, list) and raw and all(isinstance(t, list) for t in raw):
            texts = [str(t) for t in raw]
        else:
            raise ApiError(400, "'input' is required.", param="input", code="missing_required_parameter")
        dims = _positive_int(data.get("dimensions")) or self.config.embedding_dims
        as_base64 = data.get("encoding_format") == "base64"
        pt = sum(max(1, count_tokens(t)) for t in texts)

        def build() -> dict[str, Any]:
            items: list[dict[str, Any]] = []
            for i, text in enumerate(texts):
                vec = embedding_vector(text, dims)
                value: Any = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode() if as_base64 else vec
                items.append({"object": "embedding", "index": i, "embedding": value})
            return {"object": "list", "data": items, "model": model, "usage": {"prompt_tokens": pt, "total_tokens": pt}}

        return _Plan(pt, 0, build)

    def _response_object(
        self,
        resp_id: str,
        created_at: int,
        status: str,
        data: Mapping[str, Any],
        text: str | None,
        input_tokens: int,
        *,
        error: dict[str, Any] | None = None,
        completed_at: int | None = None,
    ) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        usage: dict[str, Any] | None = None
        if text is not None:
            output.append(
                {
                    "type": "message",
                    "id": "msg_" + resp_id.removeprefix("resp_"),
                    "status": "completed" if status == "completed" else "incomplete",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
                }
            )
            ot = count_tokens(text)
            usage = {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": ot,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + ot,
            }
        terminal = status in ("completed", "incomplete", "failed", "cancelled")
        metadata = data.get("metadata")
        return {
            "id": resp_id,
            "object": "response",
            "created_at": created_at,
            "status": status,
            "background": bool(data.get("background")),
            "completed_at": completed_at if completed_at is not None else (created_at if terminal else None),
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": data.get("instructions"),
            "max_output_tokens": data.get("max_output_tokens"),
            "metadata": metadata if isinstance(metadata, dict) else {},
            "model": data.get("model"),
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": True,
            "temperature": data.get("temperature", 1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": data.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": usage,
            "user": None,
        }

    async def infer(self, request: web.Request) -> web.StreamResponse:
        raw, data = await self._read_json(request)
        custom_id = request.headers.get(CUSTOM_ID_HEADER)
        if custom_id is None:
            metadata = data.get("metadata")
            if isinstance(metadata, dict):
                found = metadata.get("custom_id", metadata.get("sluice_custom_id"))
                if isinstance(found, str):
                    custom_id = found
                    request[_NOTES]["custom_id"] = found
        plan = self._plan(request.path, data)
        try:
            self._admit(plan.prompt_tokens + plan.completion_tokens)
        except ApiError:
            request[_NOTES]["fault"] = FAULT_RATE_LIMIT
            raise
        key = custom_id if custom_id is not None else body_key(request.path, raw)
        attempt = self.attempts.get(key, 0)
        self.attempts[key] = attempt + 1
        request[_NOTES]["attempt"] = attempt
        cfg = self.config
        u_fault, u_jitter, u_outcome = _draws(cfg.seed, key, attempt)
        fault = _pick_fault(cfg, u_fault)
        request[_NOTES]["fault"] = fault
        delay = cfg.latency_s + cfg.jitter_s * u_jitter
        if fault == FAULT_429:
            raise ApiError(
                429,
                "Rate limit reached for requests (simulated fault). Please try again later.",
                type="requests",
                code="rate_limit_exceeded",
                headers=_retry_headers(cfg.retry_after_s),
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
            raise _Dropped()
        if fault == FAULT_QUEUE_WAIT:
            status = cfg.queue_wait_status
            raise ApiError(
                status,
                "The request waited in the queue longer than allowed (simulated fault).",
                type="server_error" if status >= 500 else "requests",
                code="queue_wait_exceeded",
                headers=_retry_headers(cfg.retry_after_s),
            )
        if background:
            return _json(self._create_background(data, plan, delay, u_outcome))
        return _json(plan.build())

    def _create_background(self, data: dict[str, Any], plan: _Plan, duration: float, u: float) -> dict[str, Any]:
        cfg = self.config
        if u < cfg.failed_rate:
            outcome = "failed"
        elif u < cfg.failed_rate + cfg.incomplete_rate:
            outcome = "incomplete"
        else:
            outcome = "completed"
        prompt = _responses_prompt(data)
        text, truncated = _limit_text(answer_for(prompt), _positive_int(data.get("max_output_tokens")))
        if truncated and outcome == "completed":
            outcome = "incomplete"
        elif outcome == "incomplete":
            text = _shorten(text)
        now = self.now()
        resp = _BgResponse(
            id=self.new_id("resp_sim"),
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
        resp.timer = asyncio.get_running_loop().call_at(resp.t_done, self._settle_response, resp)
        self.responses[resp.id] = resp
        return self._describe_response(resp, now)

    def _response_status(self, resp: _BgResponse, now: float) -> str:
        if resp.cancelled_at is not None:
            return "cancelled"
        if now < resp.t_start:
            return "queued"
        if now < resp.t_done:
            return "in_progress"
        return resp.outcome

    def _describe_response(self, resp: _BgResponse, now: float) -> dict[str, Any]:
        status = self._response_status(resp, now)
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
        return self._response_object(
            resp.id, created, status, resp.data, text, resp.input_tokens, error=error, completed_at=completed_at
        )

    def _settle_response(self, resp: _BgResponse) -> None:
        if resp.settled:
            return
        resp.settled = True
        resp.timer = None
        self.emit(f"response.{self._response_status(resp, max(self.now(), resp.t_done))}", resp.id)

    async def get_response(self, request: web.Request) -> web.StreamResponse:
        resp = self.responses.get(request.match_info["id"])
        if resp is None:
            raise _not_found("response", request.match_info["id"])
        return _json(self._describe_response(resp, self.now()))

    async def cancel_response(self, request: web.Request) -> web.StreamResponse:
        resp = self.responses.get(request.match_info["id"])
        if resp is None:
            raise _not_found("response", request.match_info["id"])
        now = self.now()
        if self._response_status(resp, now) in ("queued", "in_progress"):
            resp.cancelled_at = now
            if resp.timer is not None:
                resp.timer.cancel()
                resp.timer = None
            resp.settled = True
            self.emit("response.cancelled", resp.id)
        return _json(self._describe_response(resp, now))

    async def delete_response(self, request: web.Request) -> web.StreamResponse:
        resp = self.responses.pop(request.match_info["id"], None)
        if resp is None:
            raise _not_found("response", request.match_info["id"])
        if resp.timer is not None:
            resp.timer.cancel()
        return _json({"id": resp.id, "object": "response.deleted", "deleted": True})

    async def upload_file(self, request: web.Request) -> web.StreamResponse:
        if not request.content_type.startswith("multipart/"):
            raise ApiError(400, "Files must be uploaded as multipart/form-data.", code="invalid_request")
        form = await request.post()
        purpose = form.get("purpose")
        upload = form.get("file")
        if not isinstance(purpose, str) or not purpose:
            raise ApiError(
                400, "Missing required parameter: 'purpose'.", param="purpose", code="missing_required_parameter"
            )
        if not isinstance(upload, web.FileField):
            raise ApiError(400, "Missing required parameter: 'file'.", param="file", code="missing_required_parameter")
        stored = self._store_file(upload.filename or "upload", purpose, upload.file.read())
        return _json(stored.describe())

    def _store_file(self, filename: str, purpose: str, content: bytes) -> _File:
        stored = _File(self.new_id("file-sim"), filename, purpose, content, int(time.time()))
        self.files[stored.id] = stored
        return stored

    def _file(self, ident: str) -> _File:
        found = self.files.get(ident)
        if found is None:
            raise _not_found("file", ident)
        return found

    async def list_files(self, request: web.Request) -> web.StreamResponse:
        purpose = request.query.get("purpose")
        data = [f.describe() for f in reversed(self.files.values()) if purpose in (None, f.purpose)]
        return _json({"object": "list", "data": data, "has_more": False})

    async def get_file(self, request: web.Request) -> web.StreamResponse:
        return _json(self._file(request.match_info["id"]).describe())

    async def get_file_content(self, request: web.Request) -> web.StreamResponse:
        found = self._file(request.match_info["id"])
        return web.Response(body=found.content, content_type="application/octet-stream")

    async def delete_file(self, request: web.Request) -> web.StreamResponse:
        found = self._file(request.match_info["id"])
        # gone for clients, kept for tests that check what a batch answered
        self.deleted_files[found.id] = self.files.pop(found.id)
        return _json({"id": found.id, "object": "file", "deleted": True})

    async def create_batch(self, request: web.Request) -> web.StreamResponse:
        _, data = await self._read_json(request)
        input_file_id = data.get("input_file_id")
        endpoint = data.get("endpoint")
        window = data.get("completion_window")
        metadata = data.get("metadata")
        if not isinstance(input_file_id, str) or input_file_id not in self.files:
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
        cfg = self.config
        content = self.files[input_file_id].content
        digest = hashlib.blake2b(content, digest_size=16).hexdigest()
        rows, errors = self._parse_batch(content, str(endpoint))
        if cfg.batch_validation_error:
            errors.append(
                {
                    "code": "simulated_validation_error",
                    "message": "Simulated validation failure.",
                    "param": None,
                    "line": 1,
                }
            )
        if errors:
            plan = "failed"
        elif _draws(cfg.seed, f"batch:{digest}", 0)[0] < cfg.batch_expire_fraction:
            plan = "expired"
        else:
            plan = "completed"
        now = self.now()
        batch = _Batch(
            id=self.new_id("batch_sim"),
            input_file_id=input_file_id,
            endpoint=str(endpoint),
            completion_window=window,
            metadata=metadata,
            created_at=int(time.time()),
            t0=now,
            phase_s=cfg.batch_phase_s,
            plan=plan,
            rows=rows,
            errors=errors,
            shuffle_seed=f"{cfg.seed}:{digest}",
            done_fraction=cfg.batch_expire_done_fraction if plan == "expired" else 1.0,
        )
        end = now + (1 if plan == "failed" else 3) * batch.phase_s
        batch.timer = asyncio.get_running_loop().call_at(end, self._refresh_batch, batch)
        self.batches[batch.id] = batch
        request[_NOTES]["batch_id"] = batch.id
        return _json(self._describe_batch(batch, now))

    def _parse_batch(self, content: bytes, endpoint: str) -> tuple[list[_Row], list[dict[str, Any]]]:
        cfg = self.config
        rows: list[_Row] = []
        errors: list[dict[str, Any]] = []
        seen: set[str] = set()

        def bad(line: int, code: str, message: str, param: str | None = None) -> None:
            errors.append({"code": code, "message": message, "param": param, "line": line})

        for number, raw_line in enumerate(content.splitlines(), start=1):
            if not raw_line.strip():
                continue
            try:
                item = orjson.loads(raw_line)
            except orjson.JSONDecodeError:
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
                attempt = self.attempts.get(row_key, 0)
                self.attempts[row_key] = attempt + 1
                u_done, u_error, _ = _draws(cfg.seed, row_key, attempt)
                row = _Row(number, custom_id, u_done)
                try:
                    row.plan = self._plan(endpoint, body)
                except ApiError as err:
                    row.error_status, row.error_body = err.status, err.body
                if row.plan is not None and u_error < cfg.batch_row_error_rate:
                    failure = ApiError(
                        500, "The server had an error processing this request (simulated fault).", type="server_error"
                    )
                    row.error_status, row.error_body = failure.status, failure.body
                rows.append(row)
        if not rows and not errors:
            bad(0, "empty_file", "The input file contains no requests.")
        return rows, errors

    def _batch_status(self, batch: _Batch, now: float) -> str:
        p = batch.phase_s
        if batch.cancel_t is not None:
            return "cancelled" if now >= batch.cancel_t + p else "cancelling"
        if now < batch.t0 + p:
            return "validating"
        if batch.plan == "failed":
            return "failed"
        if now < batch.t0 + 2 * p:
            return "in_progress"
        if now < batch.t0 + 3 * p:
            return "in_progress" if batch.plan == "expired" else "finalizing"
        return batch.plan

    def _progress(self, batch: _Batch, now: float) -> float:
        p = batch.phase_s
        if p <= 0:
            return 1.0
        return min(1.0, max(0.0, (now - batch.t0 - p) / p))

    def _refresh_batch(self, batch: _Batch) -> None:
        now = self.now()
        status = self._batch_status(batch, now)
        if batch.finished or status not in ("completed", "expired", "cancelled", "failed"):
            return
        batch.finished = True
        if batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if status != "failed":
            self._write_batch_files(batch, status)
        self.emit(f"batch.{status}", batch.id)

    def _write_batch_files(self, batch: _Batch, status: str) -> None:
        if status == "cancelled" and batch.cancel_t is not None:
            done_fraction = self._progress(batch, batch.cancel_t)
        else:
            done_fraction = batch.done_fraction
        leftover_code = {"expired": "batch_expired", "cancelled": "batch_cancelled"}.get(status, "")
        ok_lines: list[bytes] = []
        error_lines: list[bytes] = []
        usage = {"input_tokens": 0, "output_tokens": 0}
        for row in batch.rows:
            row_id = self.new_id("batch_req_sim")
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
            request_id = self.new_id("req_")
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
            plan = row.plan
            usage["input_tokens"] += plan.prompt_tokens
            usage["output_tokens"] += plan.completion_tokens
            ok_lines.append(
                orjson.dumps(
                    {
                        "id": row_id,
                        "custom_id": row.custom_id,
                        "response": {"status_code": 200, "request_id": request_id, "body": plan.build()},
                        "error": None,
                    }
                )
            )
        shuffler = random.Random(batch.shuffle_seed)
        shuffler.shuffle(ok_lines)
        shuffler.shuffle(error_lines)
        if ok_lines:
            out = self._store_file(f"{batch.id}_output.jsonl", "batch_output", b"\n".join(ok_lines) + b"\n")
            batch.output_file_id = out.id
        if error_lines:
            err = self._store_file(f"{batch.id}_error.jsonl", "batch_output", b"\n".join(error_lines) + b"\n")
            batch.error_file_id = err.id
        batch.counts = (len(ok_lines), len(error_lines))
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        batch.usage = usage

    def _describe_batch(self, batch: _Batch, now: float) -> dict[str, Any]:
        status = self._batch_status(batch, now)
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
            "model": None,
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
            "cancelled_at": when(status == "cancelled", (cancel_off or 0.0) + p),
            "request_counts": {"total": total, "completed": completed, "failed": failed},
            "metadata": batch.metadata,
            "usage": usage,
        }

    def _batch(self, ident: str) -> _Batch:
        batch = self.batches.get(ident)
        if batch is None:
            raise _not_found("batch", ident)
        self._refresh_batch(batch)
        return batch

    async def get_batch(self, request: web.Request) -> web.StreamResponse:
        return _json(self._describe_batch(self._batch(request.match_info["id"]), self.now()))

    async def cancel_batch(self, request: web.Request) -> web.StreamResponse:
        batch = self._batch(request.match_info["id"])
        now = self.now()
        if self._batch_status(batch, now) in ("validating", "in_progress", "finalizing"):
            batch.cancel_t = now
            if batch.timer is not None:
                batch.timer.cancel()
            batch.timer = asyncio.get_running_loop().call_at(now + batch.phase_s, self._refresh_batch, batch)
        return _json(self._describe_batch(batch, now))

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
        now = self.now()
        data = []
        for batch in page:
            self._refresh_batch(batch)
            data.append(self._describe_batch(batch, now))
        return _json(
            {
                "object": "list",
                "data": data,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
                "has_more": len(ordered) > limit,
            }
        )

    def emit(self, event_type: str, object_id: str) -> None:
        cfg = self.config
        if not cfg.webhook_url:
            return
        u_drop, u_dup, _ = _draws(cfg.seed, f"webhook:{event_type}:{object_id}", 0)
        event = {
            "id": self.new_id("evt_sim"),
            "object": "event",
            "created_at": int(time.time()),
            "type": event_type,
            "data": {"id": object_id},
        }
        entry: dict[str, Any] = {
            "t": time.time(),
            "event_id": event["id"],
            "type": event_type,
            "data_id": object_id,
            "dropped": u_drop < cfg.webhook_drop_rate,
            "duplicate": u_dup < cfg.webhook_duplicate_rate,
            "deliveries": [],
        }
        self.webhook_log.append(entry)
        if entry["dropped"]:
            return
        task = asyncio.get_running_loop().create_task(self._deliver(cfg, event, entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, cfg: SimConfig, event: dict[str, Any], entry: dict[str, Any]) -> None:
        _, _, u_jitter = _draws(cfg.seed, f"webhook:{event['type']}:{event['data']['id']}", 0)
        delay = cfg.webhook_delay_s + u_jitter * cfg.webhook_jitter_s
        if delay > 0:
            await asyncio.sleep(delay)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        body = orjson.dumps(event).decode()
        for copy in range(2 if entry["duplicate"] else 1):
            for attempt in range(4):
                if attempt:
                    await asyncio.sleep(0.25 * 2 ** (attempt - 1))
                headers = _webhook_headers(cfg.webhook_secret, str(event["id"]), body)
                try:
                    assert cfg.webhook_url is not None
                    async with self._session.post(cfg.webhook_url, data=body, headers=headers) as answer:
                        entry["deliveries"].append({"copy": copy, "status": answer.status, "t": time.time()})
                        if answer.status < 500 and answer.status != 429:
                            break
                except (TimeoutError, aiohttp.ClientError) as exc:
                    entry["deliveries"].append({"copy": copy, "status": None, "error": type(exc).__name__})

    async def admin_log(self, request: web.Request) -> web.StreamResponse:
        if request.method == "DELETE":
            self.log.clear()
            return _json({"cleared": True})
        return _json(list(self.log))

    async def admin_webhooks(self, request: web.Request) -> web.StreamResponse:
        if request.method == "DELETE":
            self.webhook_log.clear()
            return _json({"cleared": True})
        return _json(list(self.webhook_log))

    async def admin_config(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            try:
                changes = orjson.loads(await request.read())
                if not isinstance(changes, dict):
                    raise ValueError("expected a JSON object")
                self.update_config(changes)
            except (ValueError, orjson.JSONDecodeError) as exc:
                return _json({"error": {"message": str(exc), "type": "invalid_request_error"}}, status=400)
        return _json(self.config.public())

    async def admin_health(self, request: web.Request) -> web.StreamResponse:
        return _json(
            {
                "status": "ok",
                "simulator": True,
                "uptime_s": round(time.time() - self.started, 3),
                "logged_requests": len(self.log),
            }
        )

    async def admin_reset(self, request: web.Request) -> web.StreamResponse:
        self.reset()
        return _json({"reset": True})


SIM_KEY = web.AppKey("sluice_simulator", Simulator)


def _webhook_headers(secret: str | None, event_id: str, body: str) -> dict[str, str]:
    now = datetime.now(tz=UTC)
    headers = {
        "content-type": "application/json",
        "user-agent": SERVER_HEADER,
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now.timestamp())),
    }
    if secret:
        from standardwebhooks.webhooks import Webhook

        headers["webhook-signature"] = Webhook(secret).sign(event_id, now, body)
    return headers


@web.middleware
async def _middleware(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    if not request.path.startswith("/v1/"):
        response: web.StreamResponse = await handler(request)
        response.headers["Server"] = SERVER_HEADER
        return response
    sim = request.app[SIM_KEY]
    request[_NOTES] = {}
    request_id = sim.new_id("req_")
    started = time.time()
    try:
        sim.check_auth(request)
        response = await handler(request)
    except ApiError as err:
        response = err.response()
    except web.HTTPException as exc:
        response = ApiError(exc.status, f"Invalid URL ({request.method} {request.path})", code="unknown_url").response()
    except _Dropped:
        sim.record(_entry(request, started, None, request_id))
        if request.transport is not None:
            request.transport.close()
        # ending the handler this way makes aiohttp abandon the request without writing
        raise asyncio.CancelledError() from None
    except Exception:
        log.exception("simulator bug while handling %s %s", request.method, request.path)
        response = ApiError(500, "The simulator failed.", type="server_error", code="simulator_error").response()
    headers = response.headers
    headers["Server"] = SERVER_HEADER
    headers["x-request-id"] = request_id
    headers.update(sim.ratelimit_headers())
    sim.record(_entry(request, started, response.status, request_id))
    return response


def _entry(request: web.Request, started: float, status: int | None, request_id: str) -> dict[str, Any]:
    notes = request[_NOTES]
    entry = {
        "t": started,
        "method": request.method,
        "path": request.path,
        "custom_id": request.headers.get(CUSTOM_ID_HEADER) or notes.pop("custom_id", None),
        "status": status,
        "fault": notes.pop("fault", None),
        "attempt": notes.pop("attempt", None),
        "request_id": request_id,
    }
    entry.update(notes)
    return entry


def create_app(config: SimConfig | None = None) -> web.Application:
    """The simulator as an aiohttp application (the state is `app[SIM_KEY]`)."""
    sim = Simulator(config or SimConfig())
    # batch input files can be large; providers accept up to a few hundred MB
    app = web.Application(middlewares=[_middleware], client_max_size=256 * 1024 * 1024)
    app[SIM_KEY] = sim
    app.on_cleanup.append(sim.close)
    for path in BATCH_ENDPOINTS:
        app.router.add_post(path, sim.infer)
    app.router.add_get("/v1/responses/{id}", sim.get_response)
    app.router.add_delete("/v1/responses/{id}", sim.delete_response)
    app.router.add_post("/v1/responses/{id}/cancel", sim.cancel_response)
    app.router.add_post("/v1/files", sim.upload_file)
    app.router.add_get("/v1/files", sim.list_files)
    app.router.add_get("/v1/files/{id}", sim.get_file)
    app.router.add_delete("/v1/files/{id}", sim.delete_file)
    app.router.add_get("/v1/files/{id}/content", sim.get_file_content)
    app.router.add_post("/v1/batches", sim.create_batch)
    app.router.add_get("/v1/batches", sim.list_batches)
    app.router.add_get("/v1/batches/{id}", sim.get_batch)
    app.router.add_post("/v1/batches/{id}/cancel", sim.cancel_batch)
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
    config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0, *, shutdown_timeout: float = 1.0
) -> tuple[web.AppRunner, int]:
    """Start the simulator on the running loop; returns the runner (to clean up) and the port."""
    runner = web.AppRunner(create_app(config), access_log=None, shutdown_timeout=shutdown_timeout)
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


class SimulatorServer:
    """The simulator on its own thread and event loop, for tests and local runs.

    with SimulatorServer(SimConfig(latency_s=0.01)) as sim:
        client = OpenAI(base_url=sim.base_url, api_key="x")
    """

    def __init__(self, config: SimConfig | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._initial = config or SimConfig()
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> SimulatorServer:
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name="sluice-simulator", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise RuntimeError("simulator failed to start") from self._error
        if self._port is None:
            raise RuntimeError("simulator did not start in time")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            self._runner, self._port = loop.run_until_complete(start(self._initial, self.host, self._requested_port))
        except BaseException as exc:  # handed to the starting thread
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._runner.cleanup())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("simulator not started")
        return self._port

    @property
    def url(self) -> str:
        """The root URL (admin endpoints live under /sim)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as base_url."""
        return f"{self.url}/v1"

    @property
    def simulator(self) -> Simulator:
        if self._runner is None:
            raise RuntimeError("simulator not started")
        return self._runner.app[SIM_KEY]

    def call(self, fn: Callable[[Simulator], _T]) -> _T:
        """Run `fn(simulator)` on the simulator's loop and return its result."""
        if self._loop is None:
            raise RuntimeError("simulator not started")
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        sim = self.simulator

        def run() -> None:
            try:
                future.set_result(fn(sim))
            except BaseException as exc:  # re-raised in the calling thread
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout=30)

    @property
    def config(self) -> SimConfig:
        return self.simulator.config

    def configure(self, **changes: Any) -> SimConfig:
        return self.call(lambda sim: sim.update_config(changes))

    @property
    def log(self) -> list[dict[str, Any]]:
        return self.call(lambda sim: [dict(e) for e in sim.log])

    def clear_log(self) -> None:
        self.call(lambda sim: sim.log.clear())

    @property
    def webhooks(self) -> list[dict[str, Any]]:
        return self.call(lambda sim: [dict(e, deliveries=list(e["deliveries"])) for e in sim.webhook_log])

    def reset(self) -> None:
        self.call(lambda sim: sim.reset())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sluice simulator", description="Run the OpenAI-compatible provider simulator."
    )
    from local.sim_options import add_options, config_from

    add_options(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
