"""The simulator's settings: one frozen object, checked when built and when changed at runtime."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# what a cancelled (or, with "none", expired) batch hands back: `SimConfig.batch_cancel_answers`
BATCH_CANCEL_ANSWERS = ("elapsed", "none")


@dataclass(frozen=True)
class SimConfig:
    """Simulator settings. Frozen: a runtime change swaps in a new object (`updated`)."""

    latency_s: float = 0.05
    jitter_s: float = 0.0  # each answer waits latency_s + u * jitter_s, u from the fault hash
    # a request at OpenAI's flex tier (`service_tier: flex`) waits this many times as long
    flex_slowdown: float = 2.0
    # the share of flex requests answered 429 `resource_unavailable` (flex has no capacity now), as
    # the real tier does on a busy day: on by default, so that every flex test meets them
    flex_unavailable_rate: float = 0.05
    # models that refuse flex (400, param `service_tier`), as OpenAI's without flex processing do;
    # names separated by commas
    flex_refusing_models: str = "gpt-4o,gpt-4o-mini"
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
    # answers a pipeline cannot use (`structured`): off the schema the request gave, not JSON
    # though JSON was asked for, cut short at the output limit, a refusal
    rate_off_schema: float = 0.0
    rate_invalid_json: float = 0.0
    rate_truncated: float = 0.0
    rate_refusal: float = 0.0
    incomplete_rate: float = 0.0  # background responses only
    failed_rate: float = 0.0  # background responses only
    rpm_limit: int = 0  # server-wide; 0 = unlimited
    tpm_limit: int = 0  # server-wide; 0 = unlimited
    # per API key, as a third-party provider enforces a key's quota; 0 = unlimited
    quota_rpm: int = 0
    quota_tpm: int = 0
    embedding_dims: int = 16
    batch_phase_s: float = 0.2
    # how long a cancelled batch stays `cancelling` before it ends `cancelled`; 0: a phase
    batch_cancel_s: float = 0.0
    batch_expire_fraction: float = 0.0  # share of batches that end `expired`
    batch_expire_done_fraction: float = 0.5  # share of an expired batch's rows that finished
    # what a cancelled batch hands back: "elapsed", the rows it had finished by the cancel (its
    # elapsed share of the turnaround, at most its share of the in-progress phase); "none", nothing,
    # which an expired batch then hands back too (a provider's bad day: a batch late because it
    # waited in the queue has run nothing). A plan that counts on a late batch's answers fails here
    batch_cancel_answers: str = "elapsed"
    batch_validation_error: bool = False  # every batch fails validation
    batch_row_error_rate: float = 0.0  # rows answered 500 in the error file
    # a Message Batch's `results_url` as a path, not a whole URL (as a gateway or proxy may give it),
    # so that every Anthropic batch test reads it against the provider's base
    relative_results_url: bool = True
    # input tokens one model's batches may hold in the queue at once (validating, in progress,
    # finalizing), as OpenAI's per-model Batch queue limit; 0 = none
    batch_queue_limit: int = 0
    # the largest body Gemini takes inline (generateContent, or a batch's inline requests): 20 MB
    gemini_inline_limit: int = 20 * 1024 * 1024
    webhook_url: str | None = None
    webhook_secret: str | None = None  # whsec_...; None sends unsigned events
    webhook_drop_rate: float = 0.0
    webhook_duplicate_rate: float = 0.0
    webhook_delay_s: float = 0.0
    # each event waits an extra 0..jitter seconds, decided by the seed: deliveries arrive out of order
    webhook_jitter_s: float = 0.0
    log_limit: int = 1_000_000

    def done_when_cancelled(self, elapsed: float, phase_done: float) -> float:
        """The share of a cancelled batch's rows answered: `elapsed`, its elapsed share of the
        turnaround; `phase_done`, its share of the in-progress phase."""
        if self.batch_cancel_answers == "none":
            return 0.0
        return min(1.0, max(0.0, min(elapsed, phase_done)))

    @property
    def expired_done(self) -> float:
        """The share of an expired batch's rows answered."""
        return 0.0 if self.batch_cancel_answers == "none" else self.batch_expire_done_fraction

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (f.name.startswith("rate_") or f.name.endswith(("_rate", "_fraction"))) and not (0.0 <= value <= 1.0):
                raise ValueError(f"{f.name} must be within [0, 1], got {value}")
            if (f.name.endswith(("_s", "_limit", "_dims")) or f.name.startswith("quota_")) and value < 0:
                raise ValueError(f"{f.name} must not be negative, got {value}")
        if self.request_fault_total > 1.0 + 1e-9:
            raise ValueError("rate_429 + rate_500 + rate_drop + rate_slow + rate_queue_wait > 1")
        if self.rate_off_schema + self.rate_invalid_json + self.rate_truncated + self.rate_refusal > 1.0 + 1e-9:
            raise ValueError("rate_off_schema + rate_invalid_json + rate_truncated + rate_refusal > 1")
        if self.incomplete_rate + self.failed_rate > 1.0 + 1e-9:
            raise ValueError("incomplete_rate + failed_rate > 1")
        if not 400 <= self.queue_wait_status <= 599:
            raise ValueError(f"queue_wait_status must be an HTTP error status, got {self.queue_wait_status}")
        if self.batch_cancel_answers not in BATCH_CANCEL_ANSWERS:
            raise ValueError(
                f"batch_cancel_answers must be one of {', '.join(BATCH_CANCEL_ANSWERS)}, "
                f"got {self.batch_cancel_answers!r}"
            )
        if self.flex_slowdown < 1.0:
            raise ValueError(f"flex_slowdown must be at least 1 (flex is never faster), got {self.flex_slowdown}")
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
