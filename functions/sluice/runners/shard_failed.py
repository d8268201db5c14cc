"""ShardFailed: a shard whose step failed after its retries ends on its own, and its job runs on.

Its open work at the provider (batches, background responses) is cancelled, so that nothing goes
on billing for lines nobody will collect; what its parts hold stays in the results and errors, and
every line without an outcome goes to the errors as `shard_failed`, naming the cause.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sluice.contract import causes
from sluice.contract.model import ErrorCode
from sluice.core.failures import failure_reason
from sluice.runners.cancel import ProviderCancels, cancel_open_work, provider_work_of
from sluice.shard.assembly import assemble_outputs
from sluice.shard.frame import ShardContext, ShardSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardFailure:
    """What ShardFailed did: the cause it named, the lines it wrote to the errors for it, and what
    the provider said to the cancels of the shard's open work."""

    shard: int
    reason: str
    unfinished: int
    batches_cancelled: int = 0
    responses_cancelled: int = 0
    # "<id>: <why>" for each cancel the provider did not accept, or why none could be sent
    cancel_failures: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "reason": self.reason,
            "unfinished": self.unfinished,
            "batches_cancelled": self.batches_cancelled,
            "responses_cancelled": self.responses_cancelled,
            "cancel_failures": self.cancel_failures,
        }


@causes.under(causes.SHARD_FAILED)
async def fail_shard(ctx: ShardContext, spec: ShardSpec, *, error: str, cause: str) -> ShardFailure:
    """Cancel the shard's open provider work, then write its outputs with each unfinished line an
    error naming `error` and `cause` (as Step Functions caught them)."""
    reason = failure_reason(error, cause)
    row = ctx.store.shard(spec.job_id, spec.shard)
    work = provider_work_of(ctx.store, spec.job_id, [row] if row is not None else [])
    # the lines are still accounted for below, whatever the cancels said; what stays open is said
    cancels = await cancel_open_work(ctx, work) if work else ProviderCancels()
    if cancels.failures:
        logger.warning("shard %s: open work left at the provider: %s", spec.shard, cancels.failures)
    written = assemble_outputs(
        ctx.s3, spec, missing_code=ErrorCode.SHARD_FAILED, missing_message=f"its shard failed: {reason}", failure=reason
    )
    unfinished = int(written.stats.get("errors", {}).get(ErrorCode.SHARD_FAILED, 0))
    return ShardFailure(
        shard=spec.shard,
        reason=reason,
        unfinished=unfinished,
        batches_cancelled=cancels.batches_cancelled,
        responses_cancelled=cancels.responses_cancelled,
        cancel_failures=cancels.failures,
    )
