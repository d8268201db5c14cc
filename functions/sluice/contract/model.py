"""Types shared by the planner, the fan-out engine and the shard runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

# the processing tier a request asks its provider for where its line names none: "" the provider's
# default, or OpenAI's flex processing (a deadline job's flex shard, `ShardSpec.service_tier`); how a
# tier is asked on the wire is its family's (`RequestFormat.tiered`)
ServiceTier = Literal["", "flex"]
FLEX: Final = "flex"


class ErrorCode:
    """Stable strings users filter the errors file on."""

    INVALID_JSON = "invalid_json"
    INVALID_LINE = "invalid_line"
    MISSING_CUSTOM_ID = "missing_custom_id"
    DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
    INVALID_METHOD = "invalid_method"
    UNSUPPORTED_URL = "unsupported_url"
    INVALID_BODY = "invalid_body"
    # a field the job's provider cannot honour (`n` above 1 sent to Anthropic, ...)
    UNSUPPORTED_FIELD = "unsupported_field"
    LINE_TOO_LARGE = "line_too_large"
    INVALID_ENCODING = "invalid_encoding"
    # the provider answered with a status that retrying cannot fix (400, 401, 404, 422, ...)
    PROVIDER_ERROR = "provider_error"
    # retryable failures (429, 5xx, timeouts, dropped connections) outlasted the line's attempts:
    # `max_attempts`, or as many as its shard's faults call for (`sluice.shard.sweep`)
    RETRIES_EXHAUSTED = "retries_exhausted"
    # a background response settled as failed, or incomplete with no output
    RESPONSE_FAILED = "response_failed"
    CANCELLED = "cancelled"
    # not sent: the job's spending cap (`sluice-budget-usd`) was reached; `sluice retry --budget` sends it
    BUDGET_EXCEEDED = "budget_exceeded"
    # not sent: the shard's first answers were all the same non-retryable error (`sluice.send.refusal`)
    PROVIDER_REFUSED = "provider_refused"
    EXPIRED = "expired"
    BATCH_EXPIRED = "batch_expired"
    BATCH_CANCELLED = "batch_cancelled"
    BATCH_FAILED = "batch_failed"
    JOB_FAILED = "job_failed"
    # not finished: its shard failed after its retries (the message names the cause); its siblings ran on
    SHARD_FAILED = "shard_failed"
    # the answer failed the job's output checks (`sluice-validate`) on its last send
    INVALID_OUTPUT = "invalid_output"


@dataclass(frozen=True, slots=True)
class Request:
    """One provider call. `line` is the 1-based input line the call answers for."""

    line: int
    custom_id: str
    method: str
    path: str
    body: bytes | None = None
    # False for a line that says `"sluice_cache": false` next to its custom_id: always sent, never kept
    cache: bool = True
    # a validating job's line sent again directly: the checks its earlier answers failed (a batch
    # row's, a background response's), which its sends go on from (`sluice.send.output_check`)
    failed_checks: tuple[str, ...] = ()
    # the tier the request is sent at, which its `body` does not name: the body stays the line as
    # asked, which the response cache keys by (a flex answer is the same answer), and the engine
    # adds the tier as it sends (`RequestFormat.tiered`)
    tier: ServiceTier = ""

    @property
    def estimated_tokens(self) -> int:
        # ~4 bytes a token is the usual rule of thumb; only used to pace a TPM limit
        return len(self.body) // 4 if self.body else 0


@dataclass(slots=True)
class Outcome:
    """What finally happened to one Request after all its attempts.

    `error_code is None` means success: `status_code` is 2xx and `body` the parsed JSON.
    On failure `status_code`/`body` hold the last HTTP response if there was one.
    """

    line: int
    custom_id: str
    status_code: int | None
    body: Any
    request_id: str | None
    error_code: str | None = None
    error_message: str | None = None
    attempts: int = 1
    latency_s: float = 0.0
    throttled: int = 0
    # the line's other failed attempts, by cause: a 5xx answer, and a connection lost or timed out
    server_errors: int = 0
    lost: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    # the outcome of the last sweep (`sluice.shard.sweep`): its attempts ran out once before
    swept: bool = False
    # a validating job's line (`sluice.send.output_check`): how it ended (valid first time, repaired,
    # invalid), and the check each of its invalid answers failed
    validation: str | None = None
    failed_checks: tuple[str, ...] = ()
    # asked at a tier (`Request.tier`, flex) and sent on at the standard one (an answer at its price):
    # the tier had no capacity, or the model refused it
    tier_fallback: bool = False

    @property
    def ok(self) -> bool:
        return self.error_code is None
