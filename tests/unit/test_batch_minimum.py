"""A provider's minimum of records per batch (Bedrock's 100), whatever the provider: a file below it
is never submitted, and its lines go direct, as RunShard sends every line missing from the parts."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from sluice.providers.batch import BatchLimits
from sluice.runners.batch.submit import collect_batch, submit_batch
from sluice.shard.frame import pending
from sluice.shard.parts import load_checkpoint

from tests.unit.fake_batch_api import FakeBatchApi
from tests.unit.helpers.batch_runner import Env
from tests.unit.helpers.batch_runner import env as env  # the fixture

LIMITS = BatchLimits(max_records=5, max_bytes=200 << 20, min_records=3)


def _with_limits(env: Env) -> Env:
    env.api = FakeBatchApi(LIMITS)
    env.ctx = replace(env.ctx, batch_api=env.api.opener())
    return env


def test_a_file_below_the_providers_minimum_goes_direct(env: Env) -> None:
    env = _with_limits(env)
    # seven lines cut at five: a file of five goes as a batch, the two left over are too few for one
    spec = env.shard(7)
    submitted = asyncio.run(submit_batch(env.ctx, spec))
    (batch_id,) = submitted.batch_ids
    assert [len(b.refs) for b in env.api.batches.values()] == [5]
    env.api.complete(batch_id)

    outcome = asyncio.run(collect_batch(env.ctx, spec))
    assert (outcome.done, outcome.fallback) == (False, True)
    done = load_checkpoint(env.s3, spec).done
    assert [r.custom_id for r in pending(env.s3, spec, done, lambda e: None)] == ["u-5", "u-6"]
    assert env.report(spec)["fallback_lines"] == 2


def test_a_shard_too_small_for_any_batch_goes_direct_at_once(env: Env) -> None:
    env = _with_limits(env)
    # even when the job reports unfinished rows as errors: these were never offered to a batch
    spec = env.shard(2, on_batch_incomplete="error")
    submitted = asyncio.run(submit_batch(env.ctx, spec))
    assert (submitted.batch_ids, submitted.wait_seconds) == ([], 0)
    assert env.api.batches == {}

    outcome = asyncio.run(collect_batch(env.ctx, spec))
    assert (outcome.done, outcome.fallback) == (False, True)
    assert [r.custom_id for r in pending(env.s3, spec, set(), lambda e: None)] == ["u-0", "u-1"]


def test_a_retried_submit_still_sends_the_small_files_lines_direct(env: Env) -> None:
    env = _with_limits(env)
    spec = env.shard(7)
    (batch_id,) = asyncio.run(submit_batch(env.ctx, spec)).batch_ids
    again = asyncio.run(submit_batch(env.ctx, spec))
    assert again.batch_ids == [batch_id] and len(env.api.submitted) == 1
    env.api.complete(batch_id)
    assert asyncio.run(collect_batch(env.ctx, spec)).fallback is True
