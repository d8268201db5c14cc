"""A Bedrock batch inference job's end, as EventBridge delivers it, wakes the shard waiting on it
(the webhook function's other door); any other event changes nothing. Polling stays the fallback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from sluice.runners.webhooks import handle_job_event
from sluice.store.jobs import JobStore

from sluice_local.cloud import LocalCloud
from sluice_local.cloud.bedrock_jobs import BedrockJobs
from tests.conftest import plan_figures

JOB_ARN = "arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/000000000001"


@pytest.fixture
def store() -> Iterator[JobStore]:
    with mock_aws():
        cloud = LocalCloud(provider_base_url="http://unused", api_key="k")
        cloud._create_resources()
        table = boto3.resource("dynamodb", region_name="us-east-1").Table(cloud.table_name)
        job_store = JobStore(table, ttl_days=1)
        job_store.record_plan("job", plan=plan_figures(100, mode="batch"), shards=[(0, 100, 100)], mode="batch")
        job_store.plan_batch_parts("job", 0, [{"model": "m", "tokens": 1, "lines": 100}])
        job_store.set_shard_batches("job", 0, [JOB_ARN])
        job_store.await_batch("job", 0, JOB_ARN)
        yield job_store


def _event(status: str, arn: str = JOB_ARN) -> dict[str, Any]:
    jobs = BedrockJobs(lambda role: None)
    jobs._create(
        jobName="sluice-x-00000-000-1",
        modelId="anthropic.claude-3-haiku-20240307-v1:0",
        roleArn="r",
        clientRequestToken="t",
        inputDataConfig={"s3InputDataConfig": {"s3Uri": "s3://b/in.jsonl"}},
        outputDataConfig={"s3OutputDataConfig": {"s3Uri": "s3://b/out/"}},
    )
    (job,) = jobs.jobs()
    job.arn, job.status = arn, status
    # the event exactly as the local cloud's emulated jobs emit it
    return BedrockJobs.event(job)


def test_a_jobs_end_wakes_the_shard_waiting_on_it(store: JobStore) -> None:
    assert store.arm_shard("job", 0, "token-1") is False
    woken: list[str] = []
    reply = handle_job_event(event=_event("PartiallyCompleted"), store=store, wake=woken.append)
    assert (reply.status, reply.outcome, woken) == (200, "accepted:woke_shard", ["token-1"])
    row = store.shard("job", 0)
    assert row is not None and row.batch_settled == "completed"


@pytest.mark.parametrize(
    "event",
    [
        _event("InProgress"),
        _event("Completed", arn=JOB_ARN.replace("0001", "0002")),
        {**_event("Completed"), "source": "aws.s3"},
    ],
    ids=["not ended", "another job", "another source"],
)
def test_other_events_wake_nothing(store: JobStore, event: dict[str, Any]) -> None:
    assert store.arm_shard("job", 0, "token-1") is False
    woken: list[str] = []
    handle_job_event(event=event, store=store, wake=woken.append)
    assert woken == []
