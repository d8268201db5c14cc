"""Bedrock batch inference under the local cloud's IAM, as the stack grants it (`sluice_local/policies.json`):
the batch steps pass the service role and the role reads the jobs' input; take either grant away
and the job fails with an error that names it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from sluice.contract import Settings
from sluice.providers.bedrock import batch as bedrock
from sluice.runners.batch.submit import collect_batch, submit_batch
from sluice.send.engine import make_session
from sluice.shard.frame import ShardContext, ShardSpec
from sluice.store.jobs import JobStore

from sluice_local import iam
from sluice_local.cloud import REGION, create_table, function_name
from sluice_local.cloud.bedrock_jobs import BedrockJobs, authorizer
from tests.conftest import plan_figures, request_line

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
NAMES = iam.LocalNames()
JOB = "granted-job"


@dataclass
class Granted:
    ctx: ShardContext
    jobs: BedrockJobs
    admin_s3: Any
    store: JobStore

    def shard(self, count: int, **fields: Any) -> ShardSpec:
        key = f"inbox/{JOB}.jsonl"
        data = b"".join(request_line(f"g-{n}") for n in range(count))
        etag = self.admin_s3.put_object(Bucket=NAMES.bucket, Key=key, Body=data)["ETag"]
        self.store.record_plan(JOB, plan=plan_figures(count, mode="batch"), shards=[(0, count, count)], mode="batch")
        return ShardSpec(
            job_id=JOB, shard=0, bucket=NAMES.bucket, key=key, etag=etag, start=0, end=len(data), first_line=1,
            lines=count, mode="batch", concurrency=8, max_attempts=2, model=MODEL, provider="bedrock", **fields,
        )  # fmt: skip


def _granted(policies: iam.Policies) -> Iterator[Granted]:
    with mock_aws():
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=NAMES.bucket)
        create_table(boto3.client("dynamodb", region_name=REGION), NAMES.table)
        with iam.enforced(policies, bucket=NAMES.bucket) as local:
            step = local.session_for(function_name("submit_batch"))
            service = local.bedrock_batch
            assert service is not None

            def service_s3(role: str) -> Any:
                assert role == iam.service_role_arn()
                return service.client("s3")

            jobs = BedrockJobs(service_s3)
            s3 = step.client("s3")
            store = JobStore(step.resource("dynamodb").Table(NAMES.table), ttl_days=1)
            opened = bedrock.opener(
                lambda: jobs.client(authorizer(policies["submit_batch"])), s3, bucket=NAMES.bucket,
                role_arn=iam.service_role_arn(),
            )  # fmt: skip
            settings = Settings(bucket=NAMES.bucket, table=NAMES.table, provider_base_url="-", api_key_secret_arn="-")
            ctx = ShardContext(s3, store, settings, "-", lambda: 900.0, make_session, batch_api=opened)
            yield Granted(ctx, jobs, boto3.client("s3", region_name=REGION), store)


@pytest.fixture
def policies(monkeypatch: pytest.MonkeyPatch) -> iam.Policies:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    return iam.load_policies()


def _without(policies: iam.Policies, role: str, action: str) -> iam.Policies:
    kept = [s for s in policies[role] if action not in iam._as_list(s["Action"])]
    assert len(kept) < len(policies[role]), f"{role} has no {action} to take away"
    return {**policies, role: kept}


def test_a_job_runs_with_the_stacks_grants(policies: iam.Policies) -> None:
    for granted in _granted(policies):
        spec = granted.shard(100)
        asyncio.run(submit_batch(granted.ctx, spec))
        granted.jobs.run_pending()
        assert [job.status for job in granted.jobs.jobs()] == ["Completed"]
        assert asyncio.run(collect_batch(granted.ctx, spec)).done is True


def test_without_pass_role_the_batch_step_cannot_create_the_job(policies: iam.Policies) -> None:
    for granted in _granted(_without(policies, "submit_batch", "iam:PassRole")):
        with pytest.raises(ClientError, match=r"iam:PassRole on arn:aws:iam::\d+:role/sluice-local-bedrock-batch"):
            asyncio.run(submit_batch(granted.ctx, granted.shard(100)))
        assert granted.jobs.jobs() == []


def test_without_the_service_roles_read_the_job_fails_naming_its_input(policies: iam.Policies) -> None:
    for granted in _granted(_without(policies, iam.BEDROCK_BATCH, "s3:GetObject")):
        spec = granted.shard(100, on_batch_incomplete="error")
        asyncio.run(submit_batch(granted.ctx, spec))
        granted.jobs.run_pending()
        (job,) = granted.jobs.jobs()
        assert job.status == "Failed"
        assert job.message and "could not read the input" in job.message and "AccessDenied" in job.message
        assert asyncio.run(collect_batch(granted.ctx, spec)).done is True
        errors = granted.admin_s3.get_object(Bucket=NAMES.bucket, Key=spec.errors_key)["Body"].read().splitlines()
        assert len(errors) == 100 and b"could not read the input" in errors[0]


def test_in_the_local_cloud_a_job_runs_by_itself_and_its_end_reaches_the_webhook_function(make_cloud) -> None:  # type: ignore[no-untyped-def]
    from sluice.store.jobs import JobStore
    from sluice_handlers.runtime import session_for

    cloud = make_cloud()
    assert cloud.bedrock_jobs is not None
    step = session_for(function_name("submit_batch"))
    admin = JobStore(boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name), ttl_days=1)
    s3 = step.client("s3")
    opened = bedrock.opener(
        lambda: cloud.bedrock_jobs.client_for("submit_batch"), s3, bucket=cloud.bucket, role_arn=iam.service_role_arn()
    )
    settings = Settings(bucket=cloud.bucket, table=cloud.table_name, provider_base_url="-", api_key_secret_arn="-")
    store = JobStore(step.resource("dynamodb").Table(cloud.table_name), ttl_days=1)
    ctx = ShardContext(s3, store, settings, "-", lambda: 900.0, make_session, batch_api=opened)
    granted = Granted(ctx, cloud.bedrock_jobs, boto3.client("s3", region_name=REGION), admin)
    spec = replace(granted.shard(100), bucket=cloud.bucket)
    (job_arn,) = asyncio.run(submit_batch(ctx, spec)).batch_ids

    # the job runs in the cloud's own thread; its end comes back as the rule would deliver it
    deadline = time.monotonic() + 30
    while (row := admin.shard(JOB, 0)) is None or row.batch_settled is None:
        assert time.monotonic() < deadline, "the job's end never reached the webhook function"
        time.sleep(0.05)
    assert row.batch_settled == "completed" and row.provider_id == job_arn
    assert asyncio.run(collect_batch(ctx, spec)).done is True


def test_without_invoke_model_a_shard_is_denied_each_request(simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from sluice_local.cloud import LocalCloud, LocalSettings, run_job
    from tests.conftest import write_jsonl

    lines = [request_line(f"i-{n}").replace(b"gpt-4o-mini", MODEL.encode()) for n in range(5)]
    runs = {}
    for name, policies in (
        ("granted", iam.load_policies()),
        ("denied", _without(iam.load_policies(), "run_shard", "bedrock:InvokeModel")),
    ):
        simulator.reset()
        settings = LocalSettings(provider="bedrock", max_attempts=2, cache="off", request_timeout_s=5.0)
        # given the simulator, as `sluice run` gives it, the cloud has it ask its IAM about each signer
        cloud = LocalCloud(
            provider_base_url=simulator.base_url, api_key="-", settings=settings, policies=policies, simulator=simulator
        )
        with cloud.running():
            runs[name] = run_job(cloud, write_jsonl(tmp_path / f"{name}.jsonl", lines))
        assert simulator.simulator.authorize_invoke is None

    assert runs["granted"].status == "SUCCEEDED" and len(runs["granted"].results) == 5
    denied = runs["denied"]
    assert denied.results == [] and len(denied.errors) == 5
    message = denied.errors[0]["error"]["message"]
    assert "bedrock:InvokeModel" in message and f"foundation-model/{MODEL}" in message
