"""What test_bedrock_batch.py and the tests beside it share."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from sluice.providers.bedrock import batch as bedrock
from sluice.shard.frame import ShardSpec

from sluice_local.cloud.bedrock_jobs import BedrockJobs
from tests.unit.helpers.batch_runner import BUCKET, Env
from tests.unit.helpers.batch_runner import env as env  # the fixture

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
ROLE = "arn:aws:iam::123456789012:role/sluice-bedrock-batch"


@dataclass
class Bedrock:
    env: Env
    jobs: BedrockJobs
    events: list[dict[str, Any]]

    def shard(self, count: int, **fields: Any) -> ShardSpec:
        # read as a Bedrock shard reads its lines: a chat line's body as the Converse body it is sent direct
        return replace(self.env.shard(count, **fields), model=MODEL, provider="bedrock")

    def objects(self, prefix: str) -> list[str]:
        listed = self.env.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", [])]


@pytest.fixture
def bed(env: Env) -> Iterator[Bedrock]:
    events: list[dict[str, Any]] = []
    jobs = BedrockJobs(lambda role: env.s3, emit=events.append)
    opened = bedrock.opener(jobs.client, env.s3, bucket=BUCKET, role_arn=ROLE)
    env.ctx = replace(env.ctx, batch_api=opened)
    yield Bedrock(env, jobs, events)
