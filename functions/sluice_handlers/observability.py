"""Structured logs and metrics for the thin handlers, through aws-lambda-powertools.

In Lambda every log line is one JSON object carrying the invocation's function, request id,
cold start, and the job and shard it works on; metrics leave once per invocation as one
CloudWatch Embedded Metric Format (EMF) record on stdout, which CloudWatch turns into metrics
without an API call. Nothing here ever logs an event, a request or response body, or a secret:
handlers pass counts and ids only.

Outside Lambda (the local runner, tests) metrics stay off and logs stay quiet, on stderr, so a
local job prints what it printed before; POWERTOOLS_METRICS_DISABLED and POWERTOOLS_LOG_LEVEL,
when set, still decide (`POWERTOOLS_LOG_LEVEL=INFO sluice run ...` shows the JSON logs).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from sluice.contract import (
    ENVIRONMENT_VARIABLE,
    JOBS_OVER_ERROR_RATE,
    METRICS_NAMESPACE,
    SERVICE,
    JobStatus,
    causes,
)
from sluice.core.aws_errors import as_step_error

WEBHOOK_REJECTION_REASONS = ("too_large", "missing_headers", "signature", "malformed", "unknown_type")
# the ways a job ends that its failed lines can make a fault (`over_error_rate`)
_JUDGED_BY_ERRORS = (JobStatus.SUCCEEDED, JobStatus.COMPLETED_WITH_ERRORS, JobStatus.FAILED)

IN_LAMBDA = bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))

Handler = Callable[[dict[str, Any], Any], Any]

logger = Logger(
    service=SERVICE,
    level=None if IN_LAMBDA or os.environ.get("POWERTOOLS_LOG_LEVEL") else "CRITICAL",
    stream=sys.stdout if IN_LAMBDA else sys.stderr,
)
metrics = Metrics(namespace=METRICS_NAMESPACE, service=SERVICE)
# Two deployments in one account and region share the namespace; the environment keeps their
# metrics (and so their alarms) apart. Every dimension here has a handful of values at most.
metrics.set_default_dimensions(environment=os.environ.get(ENVIRONMENT_VARIABLE, "local"), service=SERVICE)


def tracing_enabled() -> bool:
    flag = os.environ.get("POWERTOOLS_TRACE_DISABLED")
    if flag is not None:
        return flag.strip().lower() not in ("1", "true", "yes", "on")
    return IN_LAMBDA


# X-Ray (the functions run with active tracing): one segment per invocation, a subsegment per AWS
# call. Only botocore is patched: a shard sends thousands of provider requests, and a subsegment
# each would cost more than it tells. None outside Lambda, where there is no daemon to send to:
# creating a Tracer imports the X-Ray SDK, about a second that a local run need not pay.
tracer: Tracer | None = Tracer(service=SERVICE, patch_modules=["botocore"]) if tracing_enabled() else None

_cold_start = True
# Lambda runs one invocation per process at a time; the local runner runs several in threads.
_metrics_lock = threading.Lock()


def metrics_enabled() -> bool:
    flag = os.environ.get("POWERTOOLS_METRICS_DISABLED")
    if flag is not None:
        return flag.strip().lower() not in ("1", "true", "yes", "on")
    return IN_LAMBDA


def publish_metrics() -> None:
    """Write what this invocation recorded as one EMF record, then forget it either way.

    Powertools' own `log_metrics` warns when nothing was recorded and, with metrics disabled,
    keeps what was recorded for ever; a local run would grow it until Powertools prints it.
    """
    with _metrics_lock:
        try:
            if metrics.metric_set and metrics_enabled():
                metrics.flush_metrics()
        except Exception:
            # a metric is never worth failing the step it describes
            logger.warning("metrics not published", exc_info=True)
        finally:
            metrics.clear_metrics()


def count(name: str, value: float = 1, **dimensions: str) -> None:
    """Add to a count metric; extra dimensions add a second, finer dimension set."""
    with _metrics_lock:
        metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)
        if dimensions:
            metrics.add_dimensions(**dimensions)


def job_keys(event: Mapping[str, Any]) -> dict[str, Any]:
    """The job and shard an event is about, wherever the step keeps them."""
    keys: dict[str, Any] = {}
    shard = event.get("shard")
    if isinstance(shard, Mapping):  # a Map child's state, or AwaitShard's {"shard": ..., "token": ...}
        return job_keys(shard)
    plan = event.get("plan")
    if isinstance(plan, Mapping):  # Merge, MarkFailed: the job Plan planned
        return job_keys(plan)
    if isinstance(event.get("job_id"), str):
        keys["job_id"] = event["job_id"]
    if isinstance(shard, int) and not isinstance(shard, bool):
        keys["shard"] = shard
    return keys


def scalars(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers and flags of an outcome: safe to log, unlike anything that may hold content."""
    return {k: v for k, v in outcome.items() if isinstance(v, bool | int | float)}


def _lambda_keys(context: Any) -> dict[str, Any]:
    # The local runner's context has only some of the attributes Lambda's has.
    keys = {
        "function_name": getattr(context, "function_name", None),
        "function_request_id": getattr(context, "aws_request_id", None),
        "function_memory_size": getattr(context, "memory_limit_in_mb", None),
    }
    return {k: v for k, v in keys.items() if v is not None}


def instrumented(handler: Handler) -> Handler:
    """What Powertools' `inject_lambda_context` and `log_metrics` do, safe for local runs too.

    A throttled or failing AWS call fails the step as `Transient`, which the state machine retries.

    Keys go into the thread's own log context: the local runner runs several Lambdas at once in
    threads of one process, where the shared keys of `inject_lambda_context` would mix jobs.
    """

    traced = handler if tracer is None else tracer.capture_lambda_handler(handler, capture_response=False)
    # a step's calls that no narrower cause claims are its invocation's (the module is the step)
    cause = causes.STEP_CAUSES.get(handler.__module__.rsplit(".", 1)[-1])

    @functools.wraps(handler)
    def wrapper(event: dict[str, Any], context: Any) -> Any:
        global _cold_start
        cold_start, _cold_start = _cold_start, False
        logger.thread_safe_clear_keys()
        logger.thread_safe_append_keys(cold_start=cold_start, **_lambda_keys(context), **job_keys(event))
        try:
            with causes.because(cause) if cause is not None else contextlib.nullcontext():
                return traced(event, context)
        except Exception as exc:
            logger.exception("invocation failed")
            step_error = as_step_error(exc)
            if step_error is exc:
                raise
            raise step_error from exc
        finally:
            publish_metrics()
            logger.thread_safe_clear_keys()

    return wrapper


def shard_run(outcome: Mapping[str, Any]) -> None:
    """Log how far a shard run got; count the items it finished (results and errors alike)."""
    logger.info("shard run", extra=scalars(outcome))
    finished = outcome.get("sent")
    if isinstance(finished, int) and not isinstance(finished, bool) and finished > 0:
        count("ItemsCompleted", finished)


def job_finished(detail: Mapping[str, Any], *, failed: bool) -> None:
    """Count the job, and its lines by where they ended (known once the outputs are written)."""
    count("JobsFailed" if failed else "JobsCompleted")
    counts = detail.get("counts")
    if isinstance(counts, Mapping):
        count("ItemsSucceeded", int(counts.get("results", 0)))
        count("ItemsFailed", int(counts.get("errors", 0)))
    # the one alarm on how jobs end reads this: a job whose execution succeeded may still have
    # failed its user, and Step Functions' own metrics cannot tell
    if over_error_rate(detail):
        count(JOBS_OVER_ERROR_RATE)
    fields = {"status": detail.get("status"), **(scalars(counts) if isinstance(counts, Mapping) else {})}
    if failed:
        logger.error("job failed", extra={**fields, "reason": detail.get("error")})
    else:
        logger.info("job finished", extra=fields)


def over_error_rate(detail: Mapping[str, Any]) -> bool:
    """Whether a job that ended (the detail of its event) failed more of its lines than it allows:
    its status says so (Merge's COMPLETED_WITH_ERRORS, or FAILED with lines in errors), its rate
    is past its max_error_rate, or not one of its requests got a result. A job refused before it
    had lines (no counts) is not: its user's input, not the provider, is at fault; nor is one its
    user stopped, or its spending cap (its unsent lines are errors by intent)."""
    counts, status = detail.get("counts"), detail.get("status")
    if not isinstance(counts, Mapping) or status not in _JUDGED_BY_ERRORS:
        return False
    errors, results = int(counts.get("errors", 0)), int(counts.get("results", 0))
    if errors == 0:
        return False
    if status != JobStatus.SUCCEEDED or results == 0:
        return True
    rate, allowed = detail.get("error_rate"), detail.get("max_error_rate")
    return isinstance(rate, int | float) and isinstance(allowed, int | float) and rate > allowed


def webhook_answered(outcome: str, event_type: str | None, status: int) -> None:
    """One log line and one metric per webhook: the reply, never the payload or headers."""
    kind, _, reason = outcome.partition(":")
    if kind == "rejected":
        reason = reason if reason in WEBHOOK_REJECTION_REASONS else "other"
        count("WebhookRejected", reason=reason)
        logger.warning("webhook rejected", extra={"reason": reason, "status": status})
        return
    count("WebhookDuplicate" if kind == "duplicate" else "WebhookAccepted")
    logger.info("webhook accepted", extra={"outcome": outcome, "event_type": event_type, "status": status})
