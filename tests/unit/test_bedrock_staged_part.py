"""A Bedrock part that the model's queue refuses keeps its input file in S3: each later attempt
creates its job from that file, with no new PUT of up to 1 GB and no read of the shard's input to
build it again; the file goes once the job's answers are in, as every job's files do."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sluice.contract import BEDROCK_INPUT_PREFIX, BEDROCK_OUTPUT_PREFIX
from sluice.runners.batch import advance
from sluice.runners.batch.submit import collect_batch, submit_batch

from tests.unit.helpers.batch_runner import BUCKET
from tests.unit.helpers.batch_runner import env as env  # the fixture
from tests.unit.helpers.bedrock_batch import Bedrock
from tests.unit.helpers.bedrock_batch import bed as bed  # the fixture


def _count_s3(bed: Bedrock) -> list[tuple[str, str]]:
    """Every PutObject, multipart upload, GetObject and HeadObject the shard's S3 client makes, by key."""
    calls: list[tuple[str, str]] = []

    def seen(params: dict[str, Any], model: Any, **_: Any) -> None:
        calls.append((model.name, params.get("Key", "")))

    for operation in ("PutObject", "CreateMultipartUpload", "GetObject", "HeadObject"):
        bed.env.s3.meta.events.register(f"before-parameter-build.s3.{operation}", seen)
    return calls


def test_a_requeued_part_is_put_once_and_never_built_again(bed: Bedrock, monkeypatch: pytest.MonkeyPatch) -> None:
    # the next attempt may go at once: the test plays the queue, not the clock
    monkeypatch.setattr(advance, "_requeue_delay_s", lambda settings, attempt: 0.0)
    bed.jobs.jobs_per_model = 0
    spec = bed.shard(120)
    calls = _count_s3(bed)

    def staged_puts() -> list[str]:
        return [
            key
            for op, key in calls
            if op in ("PutObject", "CreateMultipartUpload") and key.startswith(BEDROCK_INPUT_PREFIX)
        ]

    assert asyncio.run(submit_batch(bed.env.ctx, spec)).batch_ids == []
    (staged,) = staged_puts()
    assert bed.objects(BEDROCK_INPUT_PREFIX) == [staged]
    reads_of_input = sum(1 for op, key in calls if op == "GetObject" and key == spec.key)

    # three more refusals, minutes apart on AWS: the file stays, nothing is put or read again
    for _ in range(3):
        assert asyncio.run(collect_batch(bed.env.ctx, spec)).waiting == 0
    assert bed.jobs.jobs() == [] and staged_puts() == [staged]
    assert sum(1 for op, key in calls if op == "GetObject" and key == spec.key) == reads_of_input
    assert bed.objects(BEDROCK_INPUT_PREFIX) == [staged]

    # room at last: the job is created from the staged file, under its attempt's name
    bed.jobs.jobs_per_model = 1
    assert asyncio.run(collect_batch(bed.env.ctx, spec)).waiting == 1
    (job,) = bed.jobs.jobs()
    assert job.input_uri == f"s3://{BUCKET}/{staged}" and job.name.endswith("-000-5")
    assert staged_puts() == [staged]

    bed.jobs.run_pending()
    assert asyncio.run(collect_batch(bed.env.ctx, spec)).done is True
    results, errors = bed.env.outputs(spec)
    assert errors == [] and [r["custom_id"] for r in results] == [f"u-{n}" for n in range(120)]
    # its files go with the job's, as before
    assert bed.objects(BEDROCK_INPUT_PREFIX) == [] and bed.objects(BEDROCK_OUTPUT_PREFIX) == []


def test_a_part_whose_staged_file_is_gone_is_built_and_put_again(bed: Bedrock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advance, "_requeue_delay_s", lambda settings, attempt: 0.0)
    bed.jobs.jobs_per_model = 0
    spec = bed.shard(100)
    asyncio.run(submit_batch(bed.env.ctx, spec))
    (staged,) = bed.objects(BEDROCK_INPUT_PREFIX)
    # say the lifecycle rule or a person removed it
    bed.env.s3.delete_object(Bucket=BUCKET, Key=staged)
    bed.jobs.jobs_per_model = 1
    assert asyncio.run(collect_batch(bed.env.ctx, spec)).waiting == 1
    assert bed.objects(BEDROCK_INPUT_PREFIX) == [staged]
    bed.jobs.run_pending()
    assert asyncio.run(collect_batch(bed.env.ctx, spec)).done is True
    assert len(bed.env.outputs(spec)[0]) == 100
