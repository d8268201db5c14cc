"""The batch runners against an in-memory provider (`fake_batch_api.FakeBatchApi`), on moto.

What SubmitBatch and CollectBatch do whatever the provider: submit each file once, match answers
to lines by the provider's row refs (here `r<line>`, never the custom_id), keep input order,
leave unfinished lines to RunShard, requeue a batch its full queue refused, and cancel.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from sluice.runners.batch.submit import collect_batch, submit_batch
from sluice.runners.cancel import ProviderWork, cancel_at_provider
from sluice.shard.frame import pending
from sluice.shard.parts import load_checkpoint
from sluice.store.jobs import JobStore

from tests.unit.helpers.batch_runner import JOB, Env
from tests.unit.helpers.batch_runner import env as env


def test_a_part_is_submitted_once_however_often_its_submit_is_retried(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = env.shard(4)
    recorded = JobStore.set_shard_batches

    def lost(self: JobStore, job_id: str, shard: int, batch_ids: list[str]) -> None:
        raise ConnectionError("the Lambda died before DynamoDB heard of the batch")

    monkeypatch.setattr(JobStore, "set_shard_batches", lost)
    with pytest.raises(ConnectionError):
        asyncio.run(submit_batch(env.ctx, spec))
    (created,) = env.api.batches
    monkeypatch.setattr(JobStore, "set_shard_batches", recorded)

    for _ in range(2):
        again = asyncio.run(submit_batch(env.ctx, spec))
        assert again.batches_created == 0 and again.batch_ids == [created]
    assert len(env.api.submitted) == 1
    row = env.store.shard(JOB, 0)
    assert row is not None and row.batch_ids == (created,)


def test_a_completed_batchs_rows_become_outcomes_in_input_order(env: Env) -> None:
    spec = env.shard(6)
    (batch_id,) = asyncio.run(submit_batch(env.ctx, spec)).batch_ids
    assert asyncio.run(collect_batch(env.ctx, spec)).waiting == 1
    # the provider answers in its own order, and one row with a 500
    env.api.complete(batch_id, order=[f"r{n}" for n in (4, 1, 6, 3, 2, 5)], failing=["r3"])

    assert asyncio.run(collect_batch(env.ctx, spec)).done is True
    results, errors = env.outputs(spec)
    assert [r["custom_id"] for r in results] == ["u-0", "u-1", "u-3", "u-4", "u-5"]
    # each answer is its own line's: the fake echoes the body it was given
    assert all(r["response"]["body"]["echo"]["messages"][0]["content"].endswith(("great", "awful")) for r in results)
    assert [r["response"]["request_id"] for r in results] == ["req_r1", "req_r2", "req_r4", "req_r5", "req_r6"]
    assert [(e["custom_id"], e["error"]["code"], e["response"]["status_code"]) for e in errors] == [
        ("u-2", "provider_error", 500)
    ]
    # its created-to-completed time, measured for later deadline plans of its model
    assert env.report(spec)["batches"] == [
        {"id": batch_id, "status": "completed", "requests": 6, "results": 5, "errors": 1, "unfinished": 0,
         "left": 0, "turnaround_s": 60.0, "model": "gpt-4o-mini", "measured_s": 60.0,
         "censored_s": None}
    ]  # fmt: skip
    # the files at the provider are deleted once the answers are in S3
    assert env.api.deleted == [f"in_{batch_id.removeprefix('fb_')}", f"out_{batch_id}"]


def test_an_expired_batchs_missing_lines_are_left_to_go_direct(env: Env) -> None:
    spec = env.shard(6)
    (batch_id,) = asyncio.run(submit_batch(env.ctx, spec)).batch_ids
    env.api.expire(batch_id, answered=2, marked=2)

    outcome = asyncio.run(collect_batch(env.ctx, spec))
    assert (outcome.done, outcome.fallback) == (False, True)
    done = load_checkpoint(env.s3, spec).done
    assert done == {1, 2}
    # what RunShard sends next: the four lines the batch did not answer, whether it named them or not
    assert [r.custom_id for r in pending(env.s3, spec, done, lambda e: None)] == ["u-2", "u-3", "u-4", "u-5"]
    assert env.report(spec)["fallback_lines"] == 4

    reported = env.shard(6, shard=1, on_batch_incomplete="error")
    (second,) = asyncio.run(submit_batch(env.ctx, reported)).batch_ids
    env.api.expire(second, answered=2, marked=2)
    assert asyncio.run(collect_batch(env.ctx, reported)).done is True
    results, errors = env.outputs(reported)
    assert len(results) == 2 and [e["error"]["code"] for e in errors] == ["batch_expired"] * 4


def test_a_batch_refused_for_a_full_queue_is_submitted_again_under_its_next_attempt(env: Env) -> None:
    env.ctx = replace(env.ctx, settings=replace(env.ctx.settings, poll_seconds=0, batch_poll_max_s=0))
    spec = env.shard(3)
    (refused,) = asyncio.run(submit_batch(env.ctx, spec)).batch_ids
    env.api.refuse_for_full_queue(refused)

    assert asyncio.run(collect_batch(env.ctx, spec)).waiting == 1
    assert [(tag.part, tag.attempt) for tag in env.api.submitted] == [(0, 1), (0, 2)]
    row = env.store.shard(JOB, 0)
    assert row is not None and row.batch_requeued == 1 and row.batch_ids is not None
    (again,) = row.batch_ids
    env.api.complete(again)
    assert asyncio.run(collect_batch(env.ctx, spec)).done is True
    assert [r["custom_id"] for r in env.outputs(spec)[0]] == ["u-0", "u-1", "u-2"]


def test_a_cancel_stops_running_batches_and_their_unrun_lines_are_cancelled(env: Env) -> None:
    spec = env.shard(4, on_batch_incomplete="error")
    (running,) = asyncio.run(submit_batch(env.ctx, spec)).batch_ids
    ended = env.shard(2, shard=1)
    (finished,) = asyncio.run(submit_batch(env.ctx, ended)).batch_ids
    env.api.complete(finished)

    work = ProviderWork(batches=[running, finished, "fb_unknown"])
    answers = asyncio.run(cancel_at_provider(work, base_url="-", api_key="-", batch_api=env.api.opener()))
    assert (answers.batches_cancelled, answers.already_ended) == (1, 1)
    assert answers.failures == ["fb_unknown: HTTP 404: no such batch"]
    assert env.api.cancelled == [running]

    env.api.finish_cancel(running, answered=1)
    assert asyncio.run(collect_batch(env.ctx, spec)).done is True
    # a cancelled batch's time says only that it had not completed by then: kept as a censored figure
    [cancelled] = env.report(spec)["batches"]
    assert cancelled["status"] == "cancelled" and cancelled["turnaround_s"] and cancelled["measured_s"] is None
    assert cancelled["censored_s"] == cancelled["turnaround_s"]
    results, errors = env.outputs(spec)
    assert [r["custom_id"] for r in results] == ["u-0"]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("u-1", "batch_cancelled"),
        ("u-2", "batch_cancelled"),
        ("u-3", "batch_cancelled"),
    ]
