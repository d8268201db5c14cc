"""A batch job's shards are cut to one provider batch each (issue 41, item 4): Plan holds a batch
shard to the family's limits for one batch (records and bytes, within the deployment's
`batch_max_requests` and `batch_max_bytes`), not to `shard_lines`, so a Bedrock job of 50,000 records
is one shard and one of the model's 20 concurrent jobs instead of ten. Planned with `plan_job` on
moto, submitted and collected against the local cloud's emulated Bedrock jobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import orjson
import pytest
from sluice.contract import Settings
from sluice.merge.merge import load_manifest
from sluice.plan.job_options import BATCH_BYTES_IN_HAND, JobOptions
from sluice.plan.line_pass import MAX_SHARD_BYTES
from sluice.plan.plan import plan_job
from sluice.providers import apis
from sluice.runners.batch.submit import collect_batch, submit_batch
from sluice.shard.frame import ShardSpec, pending

from sluice_local.cloud.bedrock_jobs import BedrockJobs
from tests.conftest import request_line
from tests.unit.helpers.batch_runner import BUCKET, Env
from tests.unit.helpers.batch_runner import env as env  # the fixture

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
ROLE = "arn:aws:iam::123456789012:role/sluice-bedrock-batch"


@dataclass
class Planner:
    env: Env
    jobs: BedrockJobs

    def plan(
        self, count: int, *, name: str = "big", mode: str = "batch", pad: int = 0, **settings: Any
    ) -> list[ShardSpec]:
        """Plan a job of `count` chat lines on Bedrock; the shards of its manifest."""
        chosen = replace(self.env.ctx.settings, **settings)
        self.env.ctx = replace(
            self.env.ctx,
            settings=chosen,
            batch_api=apis.batch_api_for(chosen, "", s3=self.env.s3, bedrock=self.jobs.client),
        )
        key = f"inbox/{name}.jsonl"
        body = b"".join(request_line(f"u-{n:05d}", "x" * pad if pad else "great") for n in range(count))
        etag = self.env.s3.put_object(
            Bucket=BUCKET, Key=key, Body=body, Metadata={"sluice-mode": mode, "sluice-model": MODEL}
        )["ETag"]
        planned = plan_job(
            s3=self.env.s3,
            store=self.env.store,
            settings=chosen,
            bucket=BUCKET,
            key=key,
            etag=etag,
            execution=f"arn:aws:states:us-east-1:123456789012:execution:jobs:{name}",
        )
        return load_manifest(self.env.s3, BUCKET, planned.manifest_key)

    def records(self) -> list[int]:
        """The records of each job created, in the order they were created."""
        counts = []
        for job in self.jobs.jobs():
            key = job.input_uri.removeprefix(f"s3://{BUCKET}/")
            counts.append(len(self.env.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().splitlines()))
        return counts


@pytest.fixture
def planner(env: Env) -> Iterator[Planner]:
    # the environment's defaults, but for the family: shards of 5,000 lines, OpenAI's token queue limits
    env.ctx = replace(
        env.ctx, settings=replace(env.ctx.settings, provider="bedrock", bedrock_batch_role_arn=ROLE, shard_lines=5000)
    )
    yield Planner(env, BedrockJobs(lambda role: env.s3))


def test_a_bedrock_batch_job_of_50_000_lines_is_one_shard_and_one_job(planner: Planner) -> None:
    (shard,) = planner.plan(50_000)
    assert (shard.lines, shard.mode) == (50_000, "batch")

    submitted = asyncio.run(submit_batch(planner.env.ctx, shard))
    # Bedrock has no queue of tokens: OpenAI's tier-1 default (90,000 for a model not named) would
    # have cut the part in 22 and run them one after the other
    assert (len(submitted.batch_ids), submitted.requests) == (1, 50_000)
    assert planner.records() == [50_000]

    assert planner.jobs.run_pending() == 1
    assert asyncio.run(collect_batch(planner.env.ctx, shard)).done is True
    results, errors = planner.env.outputs(shard)
    assert errors == [] and [r["custom_id"] for r in results] == [f"u-{n:05d}" for n in range(50_000)]


def test_a_job_past_the_record_limit_splits_at_it(planner: Planner) -> None:
    shards = planner.plan(50_150)
    assert [(s.first_line, s.lines, s.mode) for s in shards] == [(1, 50_000, "batch"), (50_001, 150, "batch")]
    for shard in shards:
        asyncio.run(submit_batch(planner.env.ctx, shard))
    assert planner.records() == [50_000, 150]


def test_the_deployments_settings_cap_the_familys_limits(planner: Planner) -> None:
    """A shard of 250 lines where `batch_max_requests` is 250: the 120 left over are one more job,
    and the 30 after them, below Bedrock's 100 records, go direct as any part that small does."""
    shards = planner.plan(620, batch_max_requests=250)
    assert [s.lines for s in shards] == [250, 250, 120]
    # with the last shard's last 30 in a shard of their own: too few for a job
    tail = planner.plan(530, name="tail", batch_max_requests=250)
    assert [s.lines for s in tail] == [250, 250, 30]
    small = asyncio.run(submit_batch(planner.env.ctx, tail[2]))
    assert (small.batch_ids, small.wait_seconds) == ([], 0)
    outcome = asyncio.run(collect_batch(planner.env.ctx, tail[2]))
    assert (outcome.done, outcome.fallback) == (False, True)
    assert len(list(pending(planner.env.s3, tail[2], set(), lambda e: None))) == 30


def test_a_job_past_the_byte_limit_splits_at_it(planner: Planner) -> None:
    line = len(request_line("u-00000", "x" * 800))
    limit = 150 * line
    shards = planner.plan(1_065, batch_max_bytes=limit, pad=800)
    assert [s.lines for s in shards] == [135] * 7 + [120]
    # a shard leaves a tenth of a file's bytes for the records Bedrock's format makes of its lines
    room = int(limit * (1 - BATCH_BYTES_IN_HAND))
    assert all(s.end - s.start <= room < s.end - s.start + line for s in shards[:-1])
    for shard in shards:
        asyncio.run(submit_batch(planner.env.ctx, shard))
    # each shard one job, every record in it, within the limit
    assert planner.records() == [s.lines for s in shards]
    for job in planner.jobs.jobs():
        key = job.input_uri.removeprefix(f"s3://{BUCKET}/")
        assert len(planner.env.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()) <= limit


def test_direct_and_background_shards_keep_shard_lines(planner: Planner) -> None:
    assert [s.lines for s in planner.plan(12_000, mode="direct")] == [5000, 5000, 2000]


# the limits Plan cuts shards at, by family and mode

SETTINGS = Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="a", shard_lines=5000)


def limits(mode: str, *, metadata: dict[str, str] | None = None, **settings: Any) -> tuple[int, int]:
    chosen = replace(SETTINGS, **settings)
    return JobOptions.from_metadata({"sluice-mode": mode, **(metadata or {})}, chosen).shard_limits(chosen)


def test_each_familys_batch_shard_is_one_batch_within_the_deployments_settings() -> None:
    def room(size: int) -> int:
        return int(size * (1 - BATCH_BYTES_IN_HAND))

    mb = 1024 * 1024
    assert limits("batch") == (50_000, room(200 * mb))
    assert limits("batch", provider="bedrock") == (50_000, room(200 * mb))
    # Bedrock's 1 GiB a file only where the deployment allows that much, and never past what a shard holds
    assert limits("batch", provider="bedrock", batch_max_bytes=1 << 30) == (50_000, MAX_SHARD_BYTES)
    # Anthropic takes 100,000 requests a batch, once the deployment allows them
    assert limits("batch", provider="anthropic") == (50_000, room(200 * mb))
    anthropic = limits("batch", provider="anthropic", batch_max_requests=200_000, batch_max_bytes=1 << 30)
    assert anthropic == (100_000, room(256 * mb - 32 * 100_000))
    # an OpenAI-compatible server's limits are the settings
    assert limits("batch", batch_max_requests=80_000) == (80_000, room(200 * mb))
    for mode in ("direct", "background"):
        assert limits(mode, batch_max_requests=80_000) == (5000, MAX_SHARD_BYTES)


def test_auto_cuts_batches_where_each_full_shard_would_go_as_one() -> None:
    batch = limits("batch")
    assert limits("auto") == batch
    # a job that cannot wait a batch's window runs direct: shards of shard_lines
    assert limits("auto", metadata={"sluice-deadline-hours": "4"}) == (5000, MAX_SHARD_BYTES)
    # a full batch-sized shard would still be below auto's threshold, and go direct: it stays small
    assert limits("auto", auto_batch_min_requests=60_000) == (5000, MAX_SHARD_BYTES)
    assert limits("auto", auto_batch_min_requests=50_000) == batch


def test_a_bedrock_part_is_not_cut_at_a_token_queue_limit(planner: Planner) -> None:
    (shard,) = planner.plan(300, batch_queue_default_tokens=1_000, batch_queue_tokens=f"{MODEL}=1000")
    asyncio.run(submit_batch(planner.env.ctx, shard))
    assert planner.records() == [300]
    row = planner.env.store.shard(shard.job_id, shard.shard)
    assert row is not None and [int(p["lines"]) for p in row.batch_parts or ()] == [300]


def test_shards_cover_the_input_in_order(planner: Planner) -> None:
    shards = planner.plan(1_234, batch_max_requests=500)
    assert [(s.first_line, s.lines) for s in shards] == [(1, 500), (501, 500), (1001, 234)]
    assert [s.start for s in shards[1:]] == [s.end for s in shards[:-1]]
    raw = planner.env.s3.get_object(Bucket=BUCKET, Key=shards[0].key)["Body"].read()
    assert shards[-1].end == len(raw)
    assert orjson.loads(raw[shards[1].start :].split(b"\n", 1)[0])["custom_id"] == "u-00500"
