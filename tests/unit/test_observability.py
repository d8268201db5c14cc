"""Structured logs and EMF metrics from the handlers: what they emit, and what they never log."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sluice.store.jobs import JobStore
from sluice_handlers import observability

from sluice_local.cloud import LambdaContext
from tests.unit.helpers.observability import SECRET, call, provider_event, signed
from tests.unit.helpers.observability import deployed_webhook as deployed_webhook


def emf_records(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"_aws"')]


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    """Everything the handlers log, at every level, as Lambda would get it."""
    handler = observability.logger.registered_handler
    stream, previous_stream = io.StringIO(), handler.stream  # type: ignore[attr-defined]
    previous_level = observability.logger.log_level
    handler.stream = stream  # type: ignore[attr-defined]
    observability.logger.setLevel("DEBUG")
    try:
        yield stream
    finally:
        handler.stream = previous_stream  # type: ignore[attr-defined]
        observability.logger.setLevel(previous_level)


@pytest.fixture
def metrics_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")


def test_a_forged_webhook_is_counted_by_reason_and_its_payload_is_not_logged(
    deployed_webhook: JobStore, metrics_on: None, logs: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    body = provider_event("response.completed", "resp_a")
    headers = {**signed(body), "webhook-signature": "v1," + base64.b64encode(b"f" * 32).decode()}
    answer = call(body, headers)

    assert answer["statusCode"] == 401
    stdout = capsys.readouterr().out
    (record,) = emf_records(stdout)
    (directive,) = record["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "Sluice"
    assert directive["Metrics"] == [{"Name": "WebhookRejected", "Unit": "Count"}]
    # one set for the alarm, one per reason for the dashboard: both low-cardinality
    assert directive["Dimensions"] == [["environment", "service"], ["environment", "service", "reason"]]
    assert record["reason"] == "signature" and record["service"] == "sluice"
    assert record["WebhookRejected"] == [1.0]

    logged = logs.getvalue()
    lines = [json.loads(line) for line in logged.splitlines()]
    assert any(line["message"] == "webhook rejected" and line["reason"] == "signature" for line in lines)
    for secret_or_payload in (
        "private words",
        "resp_a",
        "evt_1",
        headers["webhook-signature"],
        SECRET,
        SECRET.removeprefix("whsec_"),
    ):
        assert secret_or_payload not in logged, secret_or_payload
        assert secret_or_payload not in stdout, secret_or_payload


def test_every_rejection_reason_is_one_of_a_few_dimension_values(
    deployed_webhook: JobStore, metrics_on: None, capsys: pytest.CaptureFixture[str]
) -> None:
    body = provider_event("response.completed", "resp_a")
    unknown = provider_event("invoice.paid", "in_1")
    cases = [
        (body, {k: v for k, v in signed(body).items() if k != "webhook-id"}),
        (b"{nope", signed(b"{nope")),
        (unknown, signed(unknown)),
        (body, signed(body, secret="whsec_" + base64.b64encode(b"x" * 32).decode())),
    ]
    for case_body, headers in cases:
        assert call(case_body, headers)["statusCode"] >= 400
    reasons = [r["reason"] for r in emf_records(capsys.readouterr().out)]
    assert reasons == ["missing_headers", "malformed", "unknown_type", "signature"]
    assert set(reasons) <= set(observability.WEBHOOK_REJECTION_REASONS)


def test_accepted_and_duplicate_webhooks_are_counted_without_a_reason(
    deployed_webhook: JobStore, metrics_on: None, capsys: pytest.CaptureFixture[str]
) -> None:
    body = provider_event("response.completed", "resp_a")
    headers = signed(body)
    assert call(body, headers)["statusCode"] == 200
    assert call(body, headers)["statusCode"] == 200
    first, second = emf_records(capsys.readouterr().out)
    assert [m["Name"] for m in first["_aws"]["CloudWatchMetrics"][0]["Metrics"]] == ["WebhookAccepted"]
    assert [m["Name"] for m in second["_aws"]["CloudWatchMetrics"][0]["Metrics"]] == ["WebhookDuplicate"]
    assert "reason" not in first and first["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["environment", "service"]]


def test_outside_lambda_metrics_are_off_and_nothing_is_kept(
    deployed_webhook: JobStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED", raising=False)
    monkeypatch.delenv("AWS_LAMBDA_FUNCTION_NAME", raising=False)
    body = b"{}"
    for _ in range(120):  # past Powertools' 100-value buffer, which would print even when disabled
        call(body, {})
    assert emf_records(capsys.readouterr().out) == []
    assert not observability.metrics.metric_set


def test_step_handlers_count_items_and_jobs_and_carry_job_and_shard_in_logs(
    metrics_on: None, logs: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    @observability.instrumented
    def run_shard(event: dict[str, Any], context: Any) -> dict[str, Any]:
        outcome = {"done": False, "run": 2, "sent": 1234, "seconds": 861.5}
        observability.shard_run(outcome)
        return {**event, **outcome}

    @observability.instrumented
    def notify(event: dict[str, Any], context: Any) -> dict[str, Any]:
        observability.job_finished(event, failed=False)
        return event

    run_shard({"job_id": "job-1", "shard": 7, "key": "inbox/secret-name.jsonl"}, LambdaContext("run-shard", 900))
    notify(
        {"job_id": "job-1", "status": "SUCCEEDED", "counts": {"results": 49_990, "errors": 10}, "outputs": {}},
        LambdaContext("notify", 30),
    )
    shard_record, job_record = emf_records(capsys.readouterr().out)
    assert shard_record["ItemsCompleted"] == [1234.0]
    assert (job_record["JobsCompleted"], job_record["ItemsSucceeded"], job_record["ItemsFailed"]) == (
        [1.0],
        [49990.0],
        [10.0],
    )

    lines = [json.loads(line) for line in logs.getvalue().splitlines()]
    (shard_line,) = [line for line in lines if line["message"] == "shard run"]
    assert (shard_line["job_id"], shard_line["shard"], shard_line["sent"]) == ("job-1", 7, 1234)
    assert shard_line["function_name"] == "run-shard" and "function_request_id" in shard_line
    (job_line,) = [line for line in lines if line["message"] == "job finished"]
    assert job_line["job_id"] == "job-1" and "shard" not in job_line


def merged(status: str, results: int, errors: int, max_error_rate: float = 0.0) -> dict[str, Any]:
    """A job's end as Notify publishes it (`Merged`)."""
    counts = {"lines": results + errors, "blank": 0, "requests": results + errors, "results": results, "errors": errors}
    rate = errors / max(1, results + errors)
    return {"job_id": "j", "status": status, "counts": counts, "error_rate": rate, "max_error_rate": max_error_rate}


@pytest.mark.parametrize(
    ("detail", "over"),
    [
        (merged("SUCCEEDED", 1000, 0), False),
        # within the job's allowance: its user asked for that
        (merged("SUCCEEDED", 990, 10, max_error_rate=0.05), False),
        (merged("COMPLETED_WITH_ERRORS", 900, 100, max_error_rate=0.05), True),
        # every line failed (a revoked key, insufficient_quota), even where the job allows it
        (merged("SUCCEEDED", 0, 1000, max_error_rate=1.0), True),
        # a rate past the allowance, whatever the status says
        (merged("SUCCEEDED", 900, 100, max_error_rate=0.05), True),
        # Merge's FAILED: a shard failed and its lines passed max_error_rate
        (merged("FAILED", 500, 500, max_error_rate=0.1), True),
        # MarkFailed's, with the lines it accounted for
        ({"job_id": "j", "status": "FAILED", "error": "x", "counts": merged("FAILED", 3, 7)["counts"]}, True),
        # refused before it had lines: no counts, the user's input at fault
        ({"job_id": "j", "status": "FAILED", "error": "sluice-mode='sideways'", "summary": "s3://b/k"}, False),
        # stopped at its cap or by its user: the unsent lines are errors by intent
        (merged("BUDGET_EXCEEDED", 10, 990), False),
        (merged("CANCELLED", 0, 1000), False),
        # an empty file
        (merged("SUCCEEDED", 0, 0), False),
    ],
)
def test_a_job_past_its_error_rate_or_with_every_line_failed_is_counted_for_the_alarm(
    metrics_on: None, capsys: pytest.CaptureFixture[str], detail: dict[str, Any], over: bool
) -> None:
    from sluice.contract import JOBS_OVER_ERROR_RATE

    @observability.instrumented
    def notify(event: dict[str, Any], context: Any) -> dict[str, Any]:
        observability.job_finished(event, failed=event["status"] == "FAILED" and "error" in event)
        return {}

    notify(detail, LambdaContext("notify", 30))
    (record,) = emf_records(capsys.readouterr().out)
    assert record.get(JOBS_OVER_ERROR_RATE) == ([1.0] if over else None)


def test_the_deployed_functions_name_the_namespace_and_service_the_handlers_emit_under() -> None:
    from infra.config import Environment
    from infra.functions import powertools_environment

    config = Environment(name="dev", map_concurrency=1, ttl_days=7, removal_policy="destroy")
    variables = powertools_environment(config)
    assert variables["POWERTOOLS_METRICS_NAMESPACE"] == observability.metrics.namespace
    assert variables["POWERTOOLS_SERVICE_NAME"] == observability.metrics.service == observability.SERVICE


def test_tracing_is_on_in_lambda_unless_powertools_trace_disabled_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(observability, "IN_LAMBDA", True)
    monkeypatch.delenv("POWERTOOLS_TRACE_DISABLED", raising=False)
    assert observability.tracing_enabled()
    monkeypatch.setenv("POWERTOOLS_TRACE_DISABLED", "true")
    assert not observability.tracing_enabled()
    monkeypatch.setattr(observability, "IN_LAMBDA", False)
    monkeypatch.delenv("POWERTOOLS_TRACE_DISABLED")
    assert not observability.tracing_enabled()


@pytest.mark.subprocess
def test_locally_there_is_no_tracer_and_the_x_ray_sdk_is_not_even_imported() -> None:
    assert observability.tracer is None
    code = "import sys; import sluice_handlers.observability; print('aws_xray_sdk.core' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    answer = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**os.environ, "PYTHONPATH": f"{root / 'functions'}:{root}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert answer.stdout.strip() == "False"
    handler = observability.instrumented(lambda event, context: {"done": True})
    assert handler({}, LambdaContext("plan", 60)) == {"done": True}


def test_in_lambda_the_handler_runs_in_an_x_ray_segment_without_its_response(monkeypatch: pytest.MonkeyPatch) -> None:
    captured: dict[str, Any] = {}

    def capture(handler: Any, **options: Any) -> Any:
        captured.update(options)
        return handler

    monkeypatch.setattr(observability, "tracer", SimpleNamespace(capture_lambda_handler=capture))
    handler = observability.instrumented(lambda event, context: {"done": True})
    assert handler({}, LambdaContext("plan", 60)) == {"done": True}
    # a step's answer is workflow state; it stays out of the traces
    assert captured == {"capture_response": False}
