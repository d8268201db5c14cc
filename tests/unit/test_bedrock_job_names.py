"""A Bedrock batch inference job's name carries its environment's prefix: two stacks in one account
(dev and prod, or two teams' dev) name their jobs apart, so each stack's rule hears only its own jobs'
state changes and each stack's listing lists only its own jobs; every name keeps to Bedrock's rule."""

from __future__ import annotations

import asyncio
import io
import re

import orjson
import pytest
from sluice.contract import (
    BEDROCK_JOB_NAME_MAX,
    BEDROCK_JOB_NAME_PATTERN,
    LOCAL_BEDROCK_JOB_NAME_PREFIX,
    Settings,
    bedrock_job_name_prefix,
)
from sluice.contract.model import Request
from sluice.providers.batch import BatchLimits, BatchTag, BatchUpload
from sluice.providers.bedrock import batch as bedrock

from sluice_local.cloud.bedrock_jobs import BedrockJobs
from tests.unit.helpers.batch_runner import BUCKET, Env
from tests.unit.helpers.batch_runner import env as env  # the fixture
from tests.unit.helpers.bedrock_batch import MODEL, ROLE

ENVIRONMENTS = ["dev", "prod", "dev2", "dev-2", "dev_2", "Dev", "a" * 40, "a" * 40 + "b", "team.x/feature+1"]


@pytest.mark.parametrize("environment", ENVIRONMENTS)
def test_every_name_keeps_to_bedrocks_rule_at_any_attempt(environment: str) -> None:
    prefix = bedrock_job_name_prefix(environment)
    job = "a-job-id-that-is-long" * 5
    for attempt in (1, 99, 99_999):
        name = bedrock.job_name(prefix, BatchTag(job, 99_999, 999, attempt))
        assert len(name) <= BEDROCK_JOB_NAME_MAX and re.fullmatch(BEDROCK_JOB_NAME_PATTERN, name), name


def test_no_environments_prefix_begins_another_environments_job_names() -> None:
    """EventBridge matches a name by its prefix: dev's must not catch dev2's, nor a long name's cut
    catch another long name's."""
    prefixes = {environment: bedrock_job_name_prefix(environment) for environment in ENVIRONMENTS}
    assert len(set(prefixes.values())) == len(ENVIRONMENTS)
    tag = BatchTag("job", 0, 0)
    for environment, prefix in prefixes.items():
        for other, other_prefix in prefixes.items():
            if other != environment:
                assert not bedrock.job_name(other_prefix, tag).startswith(prefix), (environment, other)
    # a plain environment name reads as itself; the stack of `dev` is Sluice-dev
    assert prefixes["dev"] == "sluice-dev-" and prefixes["prod"] == "sluice-prod-"
    assert LOCAL_BEDROCK_JOB_NAME_PREFIX == "sluice-local-"


def test_the_steps_read_the_prefix_from_their_settings() -> None:
    settings = Settings(bucket="b", table="t", provider_base_url="u", api_key_secret_arn="none")
    assert settings.bedrock_job_prefix == LOCAL_BEDROCK_JOB_NAME_PREFIX
    again = Settings.from_env({**settings.to_env(), "SLUICE_BEDROCK_JOB_PREFIX": "sluice-prod-"})
    assert again.bedrock_job_prefix == "sluice-prod-"


def test_two_environments_jobs_in_one_account_are_named_and_listed_apart(env: Env) -> None:
    jobs = BedrockJobs(lambda role: env.s3)
    limits = BatchLimits(max_records=bedrock.MAX_RECORDS, max_bytes=bedrock.MAX_BYTES)
    apis = {
        name: bedrock.BedrockBatchApi(
            jobs.client(),
            env.s3,
            bucket=BUCKET,
            role_arn=ROLE,
            limits=limits,
            name_prefix=bedrock_job_name_prefix(name),
        )
        for name in ("dev", "dev2")
    }
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}

    async def run() -> dict[str, list[str]]:
        for name, api in apis.items():
            row = api.encode(Request(1, "a", "POST", "/v1/messages", orjson.dumps(body)))
            upload = BatchUpload(io.BytesIO(row), "/v1/messages", MODEL, rows=1, size=len(row))
            await api.submit(upload, BatchTag(f"job-of-{name}", 0, 0))
        return {name: [status.id for status in await api.listed(since=0)] for name, api in apis.items()}

    listed = asyncio.run(run())
    names = {job.arn: job.name for job in jobs.jobs()}
    assert sorted(names.values())[0].startswith("sluice-dev-") and sorted(names.values())[1].startswith("sluice-dev2-")
    for name, arns in listed.items():
        (arn,) = arns
        assert names[arn].startswith(f"sluice-{name}-")
