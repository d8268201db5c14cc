"""MarkFailed: a job that cannot finish still writes what finished, and accounts for the rest."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import orjson
from botocore.exceptions import ClientError

from .contract import JobStatus
from .merge import merge_job
from .model import ErrorCode
from .plan import find_object, job_id_for, output_prefix


def _reason(error: str, cause: str) -> str:
    """Step Functions hands over a Lambda failure as a JSON cause; users want its message."""
    try:
        parsed = orjson.loads(cause)
    except orjson.JSONDecodeError:
        return f"{error}: {cause}" if cause else error
    if isinstance(parsed, dict) and parsed.get("errorMessage"):
        return f"{parsed.get('errorType', error)}: {parsed['errorMessage']}"
    return error


def mark_failed(*, s3: Any, store: Any, state: dict[str, Any], error: str, cause: str) -> dict[str, Any]:
    # first: the shards still running stop sending (and drawing on the budget) within one poll period
    store.stop_shards(state.get("job_id"), JobStatus.FAILED, shards=state.get("shards"))
    reason = _reason(error, cause)
    if "job_id" not in state:
        # Plan itself failed: no manifest, so the job is the input object and the reason
        detail = state["event"]["detail"] if "event" in state else state["detail"]
        bucket, key = detail["bucket"]["name"], detail["object"]["key"]
        # the object's own key, as Plan would have found it, however the event encoded it; if it
        # is gone or replaced, the event's key is all there is
        with contextlib.suppress(ClientError):
            key, _ = find_object(s3, bucket, key, detail["object"]["etag"])
        job_id = job_id_for(bucket, key, detail["object"]["etag"])
        summary_key = output_prefix(key) + ".summary.json"
        summary = {"job_id": job_id, "status": "FAILED", "error": reason, "input": f"s3://{bucket}/{key}"}
        s3.put_object(Bucket=bucket, Key=summary_key, Body=orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        if store.job(job_id) is not None:
            store.finish_job(job_id, status="FAILED", summary={"error": reason, "finished_at": time.time()})
        return {"job_id": job_id, "status": "FAILED", "error": reason, "summary": f"s3://{bucket}/{summary_key}"}
    try:
        summary = merge_job(
            s3=s3,
            store=store,
            state=state,
            status="FAILED",
            missing_code=ErrorCode.JOB_FAILED,
            missing_message=f"the job failed before this line finished ({reason})",
            error=reason,
        )
    except (ClientError, RuntimeError, KeyError) as exc:
        error = f"{reason}; writing outputs failed too: {exc}"
        store.finish_job(state["job_id"], status="FAILED", summary={"error": error})
        # the user looks for the outputs: at least a summary there says why there are none
        summary_key = state["output_prefix"] + ".summary.json"
        summary = {
            "job_id": state["job_id"],
            "status": "FAILED",
            "error": error,
            "input": f"s3://{state['bucket']}/{state['key']}",
        }
        s3.put_object(Bucket=state["bucket"], Key=summary_key, Body=orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        return {"job_id": state["job_id"], "status": "FAILED", "error": error}
    return {
        "job_id": state["job_id"],
        "status": "FAILED",
        "error": reason,
        "counts": summary["counts"],
        "outputs": summary["outputs"],
    }
