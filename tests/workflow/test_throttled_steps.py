"""A throttled AWS call inside a step slows the job down; the state machine's Retry runs the step again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from sluice.store.jobs import JobStore

from sluice_local.cloud import run_job
from tests.conftest import request_line, write_jsonl


def throttled(code: str, operation: str, status: int) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": "Rate exceeded"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, operation)


@pytest.mark.parametrize(
    ("method", "step", "error"),
    [
        ("record_plan", "plan", throttled("ProvisionedThroughputExceededException", "UpdateItem", 400)),
        ("record_progress", "run_shard", throttled("ThrottlingException", "BatchWriteItem", 400)),
        ("finish_job", "merge", throttled("SlowDown", "UpdateItem", 503)),
    ],
)
def test_a_step_throttled_once_is_retried_and_the_job_succeeds(
    make_cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, step: str, error: ClientError
) -> None:
    cloud = make_cloud(shard_lines=10)
    original = getattr(JobStore, method)
    raised: list[str] = []

    def throttled_once(self: JobStore, *args: Any, **kwargs: Any) -> Any:
        if not raised:
            raised.append(method)
            raise error
        return original(self, *args, **kwargs)

    monkeypatch.setattr(JobStore, method, throttled_once)
    path = write_jsonl(tmp_path / "throttled.jsonl", [request_line(f"t-{n}") for n in range(25)])
    run = run_job(cloud, path)

    assert raised == [method]
    assert run.status == "SUCCEEDED", run.execution
    assert [r["custom_id"] for r in run.results] == [f"t-{n}" for n in range(25)]
    assert run.verify(path).ok
    calls = [i for i in cloud.invocations if i.step == step]
    assert calls[0].error is not None and "Transient" in calls[0].error
    assert not any(i.step == "mark_failed" for i in cloud.invocations)


def test_a_denied_call_is_not_retried(make_cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cloud = make_cloud()

    def denied(self: JobStore, *args: Any, **kwargs: Any) -> Any:
        raise throttled("AccessDeniedException", "UpdateItem", 400)

    monkeypatch.setattr(JobStore, "record_plan", denied)
    run = run_job(cloud, write_jsonl(tmp_path / "denied.jsonl", [request_line("d-0")]))
    assert run.status == "FAILED"
    assert sum(1 for i in cloud.invocations if i.step == "plan") == 1
