"""Amazon Bedrock's "Batch Inference Job State Change" events, as EventBridge delivers them: which
job ended, and how, in OpenAI's words (`BatchState`). Only the ended states wake a shard; the
stack's rule lets only those through, and this reads nothing else either."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..batch import ENDED
from .records import STATES

SOURCE: Final = "aws.bedrock"
DETAIL_TYPE: Final = "Batch Inference Job State Change"


def ended_job(event: Mapping[str, Any]) -> tuple[str, str] | None:
    """(job ARN, state) of an event announcing a job's end; None for any other event."""
    if event.get("source") != SOURCE or event.get("detail-type") != DETAIL_TYPE:
        return None
    detail = event.get("detail")
    if not isinstance(detail, dict):
        return None
    arn, state = detail.get("batchJobArn"), STATES.get(str(detail.get("status")))
    if not isinstance(arn, str) or state not in ENDED:
        return None
    return arn, state
