"""Batch mode core: batch files, submit idempotency, collecting outcomes, leftovers, validation.

The provider is the simulator, spoken to through the official openai SDK; S3 and DynamoDB
are moto.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from typing import Any

import httpx2
import openai
import orjson
import pytest
from openai.resources.batches import AsyncBatches
from sluice.contract import Settings
from sluice.contract.model import ErrorCode, Outcome
from sluice.core.costs import provider_costs
from sluice.plan.plan import JobOptions, PlanError
from sluice.providers.openai.batch import batch_row, parse_row
from sluice.runners.batch.advance import batch_wait_seconds
from sluice.runners.batch.collect import row_outcome
from sluice.runners.batch.files import BatchPart, part_key, split_parts
from sluice.runners.batch.submit import collect_batch, submit_batch
from sluice.shard.parts import load_checkpoint
from sluice.store.jobs import JobStore

from tests.unit.helpers.batch import JOB, Env, lines, request
from tests.unit.helpers.batch import env as env

# batch files


def test_one_endpoint_and_one_model_per_file_in_request_order() -> None:
    requests = [
        request(1),
        request(2, url="/v1/embeddings"),
        request(3, model="gpt-4o"),
        request(4),
        request(5, url="/v1/embeddings"),
    ]
    parts = split_parts(requests, max_requests=100, max_bytes=1 << 20, encode=batch_row)
    assert [(p.index, p.endpoint, p.model, p.lines) for p in parts] == [
        (0, "/v1/chat/completions", "gpt-4o-mini", [1, 4]),
        (1, "/v1/embeddings", "gpt-4o-mini", [2, 5]),
        (2, "/v1/chat/completions", "gpt-4o", [3]),
    ]
    rows = [orjson.loads(r) for r in parts[0].content().splitlines()]
    assert rows[0] == {
        "custom_id": "c1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": orjson.loads(requests[0].body or b""),
    }
    assert [r["custom_id"] for r in rows] == ["c1", "c4"]
    for part in parts:
        part.close()


def test_files_split_at_the_request_and_byte_limits() -> None:
    by_count = split_parts([request(n) for n in range(1, 8)], max_requests=3, max_bytes=1 << 20, encode=batch_row)
    assert [p.lines for p in by_count] == [[1, 2, 3], [4, 5, 6], [7]]
    one_row = len(by_count[0].content().splitlines()[0]) + 1
    by_size = split_parts([request(n) for n in range(1, 6)], max_requests=100, max_bytes=2 * one_row, encode=batch_row)
    assert [p.lines for p in by_size] == [[1, 2], [3, 4], [5]]
    assert all(p.size <= 2 * one_row for p in by_size)
    # a row larger than the limit still gets a file of its own: the provider will say why it is too big
    huge = split_parts([request(1, pad=500), request(2)], max_requests=100, max_bytes=100, encode=batch_row)
    assert [p.lines for p in huge] == [[1], [2]]
    part = by_count[0]
    restored = BatchPart.from_manifest(part.manifest())
    assert (restored.index, restored.endpoint, restored.model, restored.lines, restored.custom_ids) == (
        0,
        "/v1/chat/completions",
        "gpt-4o-mini",
        [1, 2, 3],
        ["c1", "c2", "c3"],
    )
    for p in (*by_count, *by_size, *huge):
        p.close()


def test_output_lines_become_outcomes() -> None:
    def outcome(record: dict[str, Any], line: int, latency_s: float) -> Outcome | str | None:
        row = parse_row(record)
        return None if row is None else row_outcome(row, line, str(record["custom_id"]), latency_s)

    ok = {"custom_id": "a", "response": {"status_code": 200, "request_id": "req_1", "body": {"id": "x"}}, "error": None}
    answer = outcome(ok, 7, 3.0)
    assert isinstance(answer, Outcome) and answer.ok
    assert (answer.line, answer.custom_id, answer.status_code, answer.body, answer.request_id, answer.latency_s) == (
        7,
        "a",
        200,
        {"id": "x"},
        "req_1",
        3.0,
    )
    failed_body = {"error": {"message": "The server had an error", "type": "server_error", "code": None}}
    failed = outcome({"custom_id": "b", "response": {"status_code": 500, "body": failed_body}}, 8, 0.0)
    assert isinstance(failed, Outcome)
    assert (failed.error_code, failed.status_code) == (ErrorCode.PROVIDER_ERROR, 500)
    assert failed.error_message == "HTTP 500: The server had an error (server_error)"
    expired = {"custom_id": "c", "response": None, "error": {"code": "batch_expired", "message": "not run"}}
    assert outcome(expired, 9, 0.0) == "batch_expired"
    other = outcome({"custom_id": "d", "response": None, "error": {"code": "too_long", "message": "m"}}, 10, 0.0)
    assert isinstance(other, Outcome) and (other.error_code, other.error_message) == ("too_long", "m")
    assert outcome({"custom_id": "e"}, 11, 0.0) is None


def test_polling_backs_off_as_the_batch_ages() -> None:
    settings = Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="a", poll_seconds=10)
    assert batch_wait_seconds(settings, 0) == 10
    assert batch_wait_seconds(settings, 600) == 60
    assert batch_wait_seconds(settings, 86_400) == settings.batch_poll_max_s == 300
    # past a batch's window the wait is no longer capped: a tenth of the time waited
    assert batch_wait_seconds(settings, 5 * 86_400) == 43_200


def test_job_options_for_batch_and_auto() -> None:
    settings = Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="a")
    batch = JobOptions.from_metadata({"sluice-mode": "batch", "sluice-on-batch-incomplete": "error"}, settings)
    assert (batch.mode, batch.on_batch_incomplete) == ("batch", "error")
    assert batch.shard_mode(1, settings) == "batch"
    auto = JobOptions.from_metadata({"sluice-mode": "auto"}, settings)
    assert auto.on_batch_incomplete == "direct"
    assert auto.shard_mode(settings.auto_batch_min_requests, settings) == "batch"
    assert auto.shard_mode(settings.auto_batch_min_requests - 1, settings) == "direct"
    hurried = JobOptions.from_metadata({"sluice-mode": "auto", "sluice-deadline-hours": "2"}, settings)
    assert hurried.shard_mode(10**6, settings) == "direct"
    relaxed = JobOptions.from_metadata({"sluice-mode": "auto", "sluice-deadline-hours": "48"}, settings)
    assert relaxed.shard_mode(10**6, settings) == "batch"
    with pytest.raises(PlanError, match="sluice-on-batch-incomplete='retry'"):
        JobOptions.from_metadata({"sluice-on-batch-incomplete": "retry"}, settings)
    with pytest.raises(PlanError, match="deadline-hours='soon'"):
        JobOptions.from_metadata({"sluice-deadline-hours": "soon"}, settings)
    with pytest.raises(PlanError, match="mode=batch cannot promise"):
        JobOptions.from_metadata({"sluice-mode": "batch", "sluice-deadline-hours": "1"}, settings)


def test_cost_estimate_prices_batch_answers_at_half() -> None:
    models = {"gpt-4o-mini": [1_000_000, 1_000_000]}
    costs = provider_costs(models, {"gpt-4o-mini": [500_000, 500_000]}).to_json()
    assert costs == {"all_direct": 0.75, "all_batch": 0.375, "as_run": pytest.approx(0.5625)}
    assert provider_costs(models, {}).as_run == 0.75
    assert provider_costs({"mystery": [1, 1]}, {}).to_json() == {"as_run": None, "all_direct": None, "all_batch": None}


# submit and collect against the simulator


def test_submit_records_every_batch_and_a_retry_creates_none(env: Env) -> None:
    rows = lines(5) + lines(3, url="/v1/embeddings")
    rows[2] = b'{"custom_id": "broken"\n'
    spec = env.shard(rows)
    env.ctx = replace(env.ctx, settings=replace(env.ctx.settings, batch_max_requests=3))
    first = asyncio.run(submit_batch(env.ctx, spec))
    # 4 valid chat rows in files of at most 3, then the embeddings
    assert first.batches_created == 3 and first.requests == 7
    row = env.store.shard(JOB, 0)
    assert row is not None and row.batch_ids == tuple(first.batch_ids) and row.provider_id == first.batch_ids[0]
    batch_ids = first.batch_ids
    described = env.sim.call(lambda sim: [sim.batches[b] for b in batch_ids])
    assert [b.endpoint for b in described] == ["/v1/chat/completions", "/v1/chat/completions", "/v1/embeddings"]
    assert [b.metadata for b in described] == [{"job": JOB, "shard": "0", "part": str(n)} for n in range(3)]
    assert load_checkpoint(env.s3, spec).done == {3}  # the broken line is already an error

    again = asyncio.run(submit_batch(env.ctx, spec))
    assert again.batch_ids == first.batch_ids and again.batches_created == 0
    assert len(env.creates()) == 3


def test_a_submit_that_died_before_recording_its_batch_finds_it_at_the_provider(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = env.shard(lines(4))
    original = JobStore.set_shard_batches

    def lost(self: JobStore, job_id: str, shard: int, batch_ids: list[str]) -> None:
        raise ConnectionError("the Lambda died before DynamoDB heard of the batch")

    monkeypatch.setattr(JobStore, "set_shard_batches", lost)
    with pytest.raises(ConnectionError):
        asyncio.run(submit_batch(env.ctx, spec))
    assert len(env.creates()) == 1
    monkeypatch.setattr(JobStore, "set_shard_batches", original)
    retried = asyncio.run(submit_batch(env.ctx, spec))
    assert retried.batches_created == 0
    assert retried.batch_ids == [env.creates()[0]["batch_id"]]
    row = env.store.shard(JOB, 0)
    assert row is not None and row.batch_ids == tuple(retried.batch_ids)


def test_collect_waits_then_writes_results_in_input_order_with_row_errors(env: Env) -> None:
    env.sim.configure(batch_phase_s=0.3, batch_row_error_rate=0.2)
    spec = env.shard(lines(30))
    asyncio.run(submit_batch(env.ctx, spec))
    early = asyncio.run(collect_batch(env.ctx, spec))
    assert early.to_dict() == {"done": False, "fallback": False, "waiting": 1, "collected": 0, "wait_seconds": 1}
    assert env.wait_ended(spec).done is True
    results, errors = env.outputs(spec)
    assert len(results) + len(errors) == 30 and errors
    order = [int(r["custom_id"].split("-")[1]) for r in results]
    assert order == sorted(order)
    assert results[0]["response"]["body"]["choices"][0]["message"]["content"] in ("positive", "negative")
    assert {e["error"]["code"] for e in errors} == {"provider_error"}
    assert all(e["response"]["status_code"] == 500 for e in errors)
    report = orjson.loads(env.s3.get_object(Bucket=env.bucket, Key=spec.batch_report_key)["Body"].read())
    assert report["fallback_lines"] == 0 and report["batches"][0]["status"] == "completed"
    assert report["batch_models"]["gpt-4o-mini"][0] > 0
    # collecting again is harmless: nothing is written twice
    assert asyncio.run(collect_batch(env.ctx, spec)).done is True
    assert env.outputs(spec) == (results, errors)


def test_the_webhook_index_follows_the_batch_still_running(env: Env) -> None:
    spec = env.shard(lines(4))
    env.ctx = replace(env.ctx, settings=replace(env.ctx.settings, batch_max_requests=2))
    env.sim.configure(batch_phase_s=0.05)
    first_id, second_id = asyncio.run(submit_batch(env.ctx, spec)).batch_ids

    # hold the second batch back: it stays in progress while the first one completes
    def hold(sim: Any) -> None:
        sim.batches[second_id].phase_s = 60.0

    env.sim.call(hold)
    env.store.settle_batch(first_id, "completed")
    time.sleep(0.3)
    outcome = asyncio.run(collect_batch(env.ctx, spec))
    assert (outcome.done, outcome.waiting, outcome.collected) == (False, 1, 1)
    row = env.store.shard(JOB, 0)
    assert row is not None and row.provider_id == second_id and row.batch_settled is None
    assert row.batch_states is not None and row.batch_states[first_id]["results"] == 2
    assert env.store.arm_shard(JOB, 0, "token") is False  # a settled first batch must not wake it again


def test_expired_rows_follow_the_policy(env: Env) -> None:
    env.sim.configure(batch_expire_fraction=1.0, batch_expire_done_fraction=0.5)
    direct = env.shard(lines(20), shard=0)
    asyncio.run(submit_batch(env.ctx, direct))
    outcome = env.wait_ended(direct)
    assert (outcome.done, outcome.fallback) == (False, True)
    done = load_checkpoint(env.s3, direct).done
    assert 0 < len(done) < 20  # the finished half is kept; the rest is left for RunShard

    reported = env.shard(lines(20), shard=1, on_batch_incomplete="error")
    asyncio.run(submit_batch(env.ctx, reported))
    assert env.wait_ended(reported).done is True
    results, errors = env.outputs(reported)
    assert len(results) + len(errors) == 20 and errors
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def test_a_validation_failure_puts_the_providers_errors_on_the_rows(env: Env) -> None:
    env.sim.configure(batch_validation_error=True)
    spec = env.shard(lines(6), on_batch_incomplete="error")
    asyncio.run(submit_batch(env.ctx, spec))
    assert env.wait_ended(spec).done is True
    results, errors = env.outputs(spec)
    assert results == [] and len(errors) == 6
    assert {e["error"]["code"] for e in errors} == {"batch_failed"}
    first = errors[0]["error"]["message"]
    assert "failed validation on this row" in first and "simulated_validation_error" in first
    assert all("ended failed before running this row" in e["error"]["message"] for e in errors[1:])

    direct = env.shard(lines(6), shard=1)
    asyncio.run(submit_batch(env.ctx, direct))
    assert env.wait_ended(direct).fallback is True
    assert load_checkpoint(env.s3, direct).done == {1}  # only the row the provider blamed has an outcome


def test_a_shard_with_nothing_to_send_needs_no_batch(env: Env) -> None:
    spec = env.shard([b"not json\n", b"\n"])
    submitted = asyncio.run(submit_batch(env.ctx, spec))
    assert submitted.batch_ids == [] and env.creates() == []
    assert env.store.arm_shard(JOB, 0, "token") is True  # wakes at once
    assert asyncio.run(collect_batch(env.ctx, spec)).done is True
    results, errors = env.outputs(spec)
    assert results == [] and [e["error"]["code"] for e in errors] == ["invalid_json"]


def test_part_maps_are_written_before_the_batch_exists(env: Env) -> None:
    spec = env.shard(lines(3))
    batch_ids = asyncio.run(submit_batch(env.ctx, spec)).batch_ids
    part = BatchPart.from_manifest(env.s3.get_object(Bucket=env.bucket, Key=part_key(spec, 0))["Body"].read())
    assert (part.lines, part.custom_ids) == ([1, 2, 3], ["u-0", "u-1", "u-2"])
    batch = env.sim.call(lambda s: s.batches[batch_ids[0]])
    uploaded = env.sim.call(lambda s: s.files[batch.input_file_id].content)
    assert [orjson.loads(r)["custom_id"] for r in uploaded.splitlines()] == part.custom_ids


def test_a_create_whose_answer_is_lost_is_found_not_repeated(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    original = AsyncBatches.create
    lost: list[str] = []

    async def answer_lost(self: AsyncBatches, **kwargs: Any) -> Any:
        batch = await original(self, **kwargs)
        if not lost:
            lost.append(batch.id)
            raise openai.APITimeoutError(request=httpx2.Request("POST", env.sim.base_url + "/batches"))
        return batch

    monkeypatch.setattr(AsyncBatches, "create", answer_lost)
    spec = env.shard(lines(3))
    submitted = asyncio.run(submit_batch(env.ctx, spec))
    assert submitted.batch_ids == lost and len(env.creates()) == 1


def test_a_job_runs_only_the_shards_its_keys_rate_keeps_busy() -> None:
    """10M lines on a 30,000-RPM key, asked to run 1,000 shards of 950 connections at once: the key
    keeps 500 x 30 s = 15,000 requests in flight, which 16 shards hold; the other 984 would only wait
    in their Lambdas. With no rate known, the job runs what it asked."""
    from sluice.limits.flow import MAX_SHARD_CONNECTIONS
    from sluice.plan.job_options import KEY_LATENCY_S, rate_capped_shards

    rate = '{"gpt-4o-mini": {"rpm": 30000}}'
    settings = Settings(
        bucket="b",
        table="t",
        provider_base_url="http://x",
        api_key_secret_arn="a",
        rate_limits=rate,
        default_model="gpt-4o-mini",
        map_concurrency=1000,
        concurrency=1000 * MAX_SHARD_CONNECTIONS,
    )
    options = JobOptions.from_metadata({}, settings)
    assert options.map_concurrency == math.ceil(30000 / 60 * KEY_LATENCY_S / MAX_SHARD_CONNECTIONS) == 16
    # the job's own sluice-rpm is its key's share
    assert JobOptions.from_metadata({"sluice-rpm": "6000"}, settings).map_concurrency == 4
    # a batch job sends nothing at the key's rate
    assert JobOptions.from_metadata({"sluice-mode": "batch"}, settings).map_concurrency == 1000
    unknown = replace(settings, rate_limits="")
    assert JobOptions.from_metadata({}, unknown).map_concurrency == 1000
    # never more connections than the job's concurrency asks, never fewer than one shard
    assert rate_capped_shards(20, key_rpm=30000, concurrency=1000) == 2
    assert rate_capped_shards(20, key_rpm=1, concurrency=1000) == 1
