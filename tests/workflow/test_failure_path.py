"""The state machine's failure path and its throttling, on the local cloud: whatever breaks, a job
ends with its summary and its event; a shard Lambda refuses to start for a while, the job waits."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from sluice.merge import merge

from sluice_local.cloud import REGION, LambdaTimeout, function_arn, run_job
from tests.conftest import request_line, write_jsonl


@pytest.fixture
def retry_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits the state machine's Retry asks for, in order, taken at once: the test's clock."""
    waits: list[float] = []
    monkeypatch.setattr(retrier_decl, "time", SimpleNamespace(sleep=waits.append))
    return waits


def job_events() -> Callable[[], list[dict[str, Any]]]:
    """Every event Sluice publishes, as a user's EventBridge rule to an SQS queue receives them
    (in a running local cloud)."""
    sqs = boto3.client("sqs", region_name=REGION)
    events = boto3.client("events", region_name=REGION)
    queue = sqs.create_queue(QueueName="sluice-job-events")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events.put_rule(Name="sluice-jobs", EventPattern=json.dumps({"source": ["sluice"]}))
    events.put_targets(Rule="sluice-jobs", Targets=[{"Id": "queue", "Arn": arn}])

    def received() -> list[dict[str, Any]]:
        answer = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)
        return [json.loads(m["Body"]) for m in answer.get("Messages", [])]

    return received


def test_a_job_whose_mark_failed_times_out_still_ends_failed_with_its_summary_and_event(
    make_cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retry_waits: list[float]
) -> None:
    cloud = make_cloud(shard_lines=10, map_concurrency=1)
    received = job_events()

    def break_shard_one(step: str, payload: dict[str, Any]) -> None:
        # the shard fails, and so does the ShardFailed step that would have ended it alone
        if step in ("run_shard", "fail_shard") and payload["shard"]["shard"] == 1:
            raise RuntimeError("disk on fire")

    def outlives_its_lambda(*args: Any, **kwargs: Any) -> Any:
        raise LambdaTimeout("Task timed out after 900.00 seconds")

    cloud.before_invoke = break_shard_one
    monkeypatch.setattr(merge, "concatenate", outlives_its_lambda)
    run = run_job(cloud, write_jsonl(tmp_path / "doomed.jsonl", [request_line(f"d-{n}") for n in range(30)]))

    assert run.status == "FAILED"
    assert run.summary["status"] == "FAILED"
    # why the job failed, then why its lines could not be accounted for
    first, again = run.summary["error"].split("; accounting for its lines failed too: ")
    assert any(reason in first for reason in ("disk on fire", "States.ExceedToleratedFailureThreshold"))
    assert again == "Sandbox.Timedout: Task timed out after 900.00 seconds"
    # and still every line is accounted for, from the input alone, each saying why
    assert run.results == []
    assert [e["custom_id"] for e in run.errors] == [f"d-{n}" for n in range(30)]
    assert {e["error"]["code"] for e in run.errors} == {"job_failed"}
    assert all(run.summary["error"] in e["error"]["message"] for e in run.errors)
    assert run.summary["counts"] == {"lines": 30, "blank": 0, "requests": 30, "results": 0, "errors": 30}
    job = cloud.job(run.job_id)
    assert job is not None and job.job.status == "FAILED"
    # a timeout would only come back: MarkFailed is not run again, its last resort is
    marked = [i for i in cloud.invocations if i.step == "mark_failed"]
    assert [i.error is None for i in marked] == [False, True]
    (event,) = received()
    assert event["detail-type"] == "Sluice Job Failed"
    assert event["detail"]["job_id"] == run.job_id and event["detail"]["status"] == "FAILED"
    assert event["detail"]["error"] == run.summary["error"]


def throttled() -> ClientError:
    """What Lambda answers an invocation when the function's concurrency is taken."""
    response: Any = {
        "Error": {"Code": "TooManyRequestsException", "Message": "Rate Exceeded."},
        "ResponseMetadata": {"HTTPStatusCode": 429, "RequestId": "throttled"},
    }
    return ClientError(response, "Invoke")


def test_a_shard_whose_lambda_is_throttled_for_twenty_minutes_waits_and_its_job_succeeds(
    make_cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retry_waits: list[float]
) -> None:
    """Other jobs' shards hold every slot of the shard function's concurrency for 20 minutes."""
    cloud = make_cloud(shard_lines=100)
    invoke = lambda_eval_utils._invoke_lambda_function
    refused: list[str] = []

    def slots_taken_for_twenty_minutes(parameters: dict[str, Any], **kwargs: Any) -> Any:
        if parameters["FunctionName"] == function_arn("run_shard") and sum(retry_waits) < 20 * 60:
            refused.append(parameters["FunctionName"])
            raise throttled()
        return invoke(parameters=parameters, **kwargs)

    monkeypatch.setattr(lambda_eval_utils, "_invoke_lambda_function", slots_taken_for_twenty_minutes)
    path = write_jsonl(tmp_path / "patient.jsonl", [request_line(f"p-{n}") for n in range(20)])
    run = run_job(cloud, path)

    assert run.status == "SUCCEEDED", run.execution
    assert run.verify(path).ok and len(run.results) == 20
    assert sum(retry_waits) >= 20 * 60 and len(refused) == len(retry_waits)
    # it looks again at least every 2 minutes, so it starts soon after a slot frees
    assert max(retry_waits) <= 120
    assert not any(i.step == "mark_failed" for i in cloud.invocations)
