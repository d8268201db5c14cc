"""Batch mode within the provider's enqueued-token limit (issue 16): packing, the simulator's queue,
and shards pacing their batches under it (the queue's slots themselves: test_batch_queue_slots)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import httpx2
import openai
import orjson
import pytest
from openai.resources.batches import AsyncBatches
from sluice.contract import BatchCollected, Settings, SettingsError
from sluice.contract.model import Request
from sluice.limits.batch_queue import HOLD_GRACE_S, Hold, caught_up, estimate_tokens, queue_key, window_of
from sluice.limits.batch_queue_table import QueueTable
from sluice.providers.openai.batch import batch_row
from sluice.runners.batch.submit import collect_batch, split_parts, submit_batch

from sluice_local.simulator import SimConfig, SimulatorServer
from tests.unit.helpers.batch import JOB, Env, lines, request
from tests.unit.helpers.batch import env as batch_env  # noqa: F401  (test_batch's fixture, as `batch_env`)


def test_a_token_estimate_is_a_quarter_of_the_body_rounded_up() -> None:
    assert estimate_tokens(Request(1, "a", "POST", "/v1/chat/completions", b"x" * 9)) == 3
    assert estimate_tokens(Request(1, "a", "POST", "/v1/chat/completions", b"x" * 8)) == 2
    assert estimate_tokens(Request(1, "a", "POST", "/v1/chat/completions", None)) == 1


def test_no_file_is_larger_than_its_models_queue_limit() -> None:
    requests = [request(n, pad=396) for n in range(1, 11)] + [request(11, model="gpt-4o", pad=396)]
    each = estimate_tokens(requests[0])
    limits = {"gpt-4o-mini": each * 3, "gpt-4o": 0}
    parts = split_parts(
        requests, max_requests=50, max_bytes=1 << 20, encode=batch_row, max_tokens=lambda m: limits[m or ""]
    )
    mini = [p for p in parts if p.model == "gpt-4o-mini"]
    assert [len(p.lines) for p in mini] == [3, 3, 3, 1]
    assert all(p.tokens <= limits["gpt-4o-mini"] for p in mini)
    assert sum(p.tokens for p in mini) == 10 * each
    # a model with no limit is cut only by the request and byte limits
    assert [len(p.lines) for p in parts if p.model == "gpt-4o"] == [1]
    for part in parts:
        part.close()


def test_queue_limits_travel_in_the_settings_and_a_bad_one_is_named() -> None:
    required: dict[str, Any] = {"bucket": "b", "table": "t", "provider_base_url": "http://p", "api_key_secret_arn": "a"}
    chosen = Settings(**required, batch_queue_tokens="gpt-4o-mini=500,gpt-4o=0", batch_queue_default_tokens=7)
    back = Settings.from_env(chosen.to_env())
    assert back == chosen
    assert (back.batch_queue_limit("gpt-4o-mini"), back.batch_queue_limit("gpt-4o")) == (500, 0)
    assert back.batch_queue_limit("mystery") == 7 and back.batch_queue_limit(None) == 7
    # the defaults are OpenAI's tier-1 figures
    default = Settings(**required)
    assert default.batch_queue_limit("gpt-4o-mini") == 2_000_000 and default.batch_queue_limit("gpt-4o") == 90_000
    with pytest.raises(SettingsError, match="SLUICE_BATCH_QUEUE_TOKENS='gpt-4o=lots'"):
        Settings.from_env({**chosen.to_env(), "SLUICE_BATCH_QUEUE_TOKENS": "gpt-4o=lots"})


def _body(n: int) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"line {n} " + "x" * 380}]}


def _upload(client: openai.OpenAI, rows: int, first: int = 0) -> str:
    content = b"".join(
        orjson.dumps({"custom_id": f"f-{n}", "method": "POST", "url": "/v1/chat/completions", "body": _body(n)}) + b"\n"
        for n in range(first, first + rows)
    )
    return client.files.create(file=("in.jsonl", content, "application/jsonl"), purpose="batch").id


def test_the_simulator_fails_a_batch_over_the_queue_limit_as_openai_does() -> None:
    with SimulatorServer(SimConfig(latency_s=0.0, batch_phase_s=0.3, batch_queue_limit=250)) as sim:
        client = openai.OpenAI(base_url=sim.base_url, api_key="sk-test")
        first = client.batches.create(
            input_file_id=_upload(client, 2), endpoint="/v1/chat/completions", completion_window="24h"
        )
        second = client.batches.create(
            input_file_id=_upload(client, 1, 2), endpoint="/v1/chat/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 5
        while client.batches.retrieve(second.id).status == "validating":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        failed = client.batches.retrieve(second.id)
        assert failed.status == "failed" and failed.failed_at and failed.output_file_id is None
        assert failed.errors is not None and failed.errors.data
        problem = failed.errors.data[0]
        assert (problem.code, problem.param, problem.line) == ("token_limit_exceeded", None, None)
        assert "Enqueued token limit reached for gpt-4o-mini" in (problem.message or "")
        assert "Limit: 250 enqueued tokens" in (problem.message or "")
        # the tokens go back when the running batch ends
        while client.batches.retrieve(first.id).status != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        third = client.batches.create(
            input_file_id=_upload(client, 1, 3), endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert third.model == "gpt-4o-mini"
        while client.batches.retrieve(third.id).status not in ("completed", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert client.batches.retrieve(third.id).status == "completed"
        first_tokens = sum(-(-len(orjson.dumps(_body(n))) // 4) for n in (0, 1))
        assert sim.call(lambda s: (s.batch_api.limit_refusals, s.batch_api.peak_enqueued)) == (
            1,
            {"gpt-4o-mini": first_tokens},
        )


def _run_shards(env: Env, specs: list[Any]) -> list[BatchCollected]:
    for spec in specs:
        asyncio.run(submit_batch(env.ctx, spec))
    finished: dict[int, BatchCollected] = {}
    deadline = time.monotonic() + 60
    while len(finished) < len(specs):
        assert time.monotonic() < deadline, "the shards never finished"
        for spec in specs:
            if spec.shard not in finished:
                outcome = asyncio.run(collect_batch(env.ctx, spec))
                if outcome.done or outcome.fallback:
                    finished[spec.shard] = outcome
        time.sleep(0.05)
    return [finished[spec.shard] for spec in specs]


def test_two_shards_never_hold_more_than_the_limit_and_finish_every_line(batch_env: Env) -> None:  # noqa: F811
    env = batch_env
    # the simulator counts without refusing: what it saw enqueued is what the shards chose
    env.sim.configure(batch_phase_s=0.1)
    limit = 300
    env.ctx = replace(env.ctx, settings=replace(env.ctx.settings, batch_queue_tokens=f"gpt-4o-mini={limit}"))
    specs = [env.shard(lines(20), shard=s) for s in (0, 1)]
    outcomes = _run_shards(env, specs)
    assert all(o.done for o in outcomes)
    for spec in specs:
        results, errors = env.outputs(spec)
        assert len(results) == 20 and errors == []
    peak, refusals = env.sim.call(lambda s: (s.batch_api.peak_enqueued, s.batch_api.limit_refusals))
    assert refusals == 0
    assert 0 < peak["gpt-4o-mini"] <= limit
    # 40 lines of about 30 tokens: several rounds of batches, more than fit at once
    assert len(env.creates()) >= 4
    # every hold went back
    assert _queue_left(env, limit, [(JOB, 0), (JOB, 1)]) == ([], limit)


def _queue_left(env: Env, limit: int, shards: list[tuple[str, int]]) -> tuple[list[Hold], int]:
    """The holds of `shards` not released, and the spare tokens of the key's gpt-4o-mini queue."""
    queue = QueueTable(env.store.table)
    name = queue_key(env.ctx.settings.provider_base_url, env.ctx.api_key, "gpt-4o-mini")
    slots, _ = queue.slots(name)
    spare = sum(caught_up(slot, i, limit, window_of(time.time()))[0].spare for i, slot in slots.items())
    return [row.hold for row in queue.unreleased(shards)], spare


def test_a_batch_refused_for_a_full_queue_is_created_again_and_leaves_no_file(batch_env: Env) -> None:  # noqa: F811
    env = batch_env
    # a batch keeps the phase it was created with: the other program's lasts 3 s, long enough
    # to be running when the shard creates its own however loaded the machine is
    env.sim.configure(batch_phase_s=1.0, batch_queue_limit=400)
    env.ctx = replace(env.ctx, settings=replace(env.ctx.settings, batch_queue_tokens="gpt-4o-mini=400", poll_seconds=1))
    client = openai.OpenAI(base_url=env.sim.base_url, api_key="sk-test")
    # another program on the same key fills most of the queue, unknown to Sluice's accounting
    client.batches.create(input_file_id=_upload(client, 3), endpoint="/v1/chat/completions", completion_window="24h")
    env.sim.configure(batch_phase_s=0.2)
    spec = env.shard(lines(8))
    submitted = asyncio.run(submit_batch(env.ctx, spec))
    assert submitted.batches_created == 1
    refused_id = submitted.batch_ids[0]
    refused = env.sim.call(lambda s: s.batches[refused_id])
    outcome = _run_shards(env, [spec])[0]
    assert outcome.done is True
    results, errors = env.outputs(spec)
    assert [r["custom_id"] for r in results] == [f"u-{n}" for n in range(8)] and errors == []
    creates = env.sim.call(lambda s: list(s.batches.values()))
    ours = [b for b in creates if (b.metadata or {}).get("job") == JOB]
    # refused while the other program's batch runs (once or more, by how the backoff falls), then created
    *refusals, last = ours
    assert refusals and [b.plan for b in refusals] == ["failed"] * len(refusals) and last.plan == "completed"
    assert last.metadata == {"job": JOB, "shard": "0", "part": "0", "try": str(len(ours))}
    # the refused batches' uploaded files are gone from the provider
    assert env.sim.call(lambda s: any(b.input_file_id in s.files for b in refusals)) is False
    assert refused.id == refusals[0].id
    row = env.store.shard(JOB, 0)
    assert row is not None and row.batch_ids == (last.id,) and row.batch_requeued == len(refusals)
    report = orjson.loads(env.s3.get_object(Bucket=env.bucket, Key=spec.batch_report_key)["Body"].read())
    assert report["requeued"] == len(refusals) and [b["id"] for b in report["batches"]] == [last.id]


def test_a_hold_left_by_a_shard_that_died_is_reconciled_away_and_the_queue_moves(batch_env: Env) -> None:  # noqa: F811
    env = batch_env
    env.sim.configure(batch_phase_s=0.05)
    env.ctx = replace(env.ctx, settings=replace(env.ctx.settings, batch_queue_tokens="gpt-4o-mini=300"))
    long_ago = time.time() - HOLD_GRACE_S - 100
    queue = QueueTable(env.store.table, clock=lambda: long_ago)
    name = queue_key(env.ctx.settings.provider_base_url, env.ctx.api_key, "gpt-4o-mini")
    # a shard of another job reserved the whole queue for two files, created the first one's
    # batch, which ended long ago, and died before it created the second or released either
    created, never = Hold("dead-job", 0, 0, 1), Hold("dead-job", 0, 1, 1)
    assert queue.reserve(name, created, 200, 300).granted and queue.reserve(name, never, 100, 300).granted
    client = openai.OpenAI(base_url=env.sim.base_url, api_key="sk-test")
    batch = client.batches.create(
        input_file_id=_upload(client, 1),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "dead-job", "shard": "0", "part": "0"},
    )
    deadline = time.monotonic() + 5
    while client.batches.retrieve(batch.id).status != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    env.sim.call(lambda s: setattr(s.batches[batch.id], "created_at", int(long_ago)))
    spec = env.shard(lines(5))
    submitted = asyncio.run(submit_batch(env.ctx, spec))
    assert submitted.batches_created == 1
    assert _queue_left(env, 300, [("dead-job", 0), (JOB, 0)])[0] == [Hold(JOB, 0, 0, 1)]
    assert _run_shards(env, [spec])[0].done is True
    assert _queue_left(env, 300, [("dead-job", 0), (JOB, 0)]) == ([], 300)


def test_a_create_refused_outright_for_a_full_queue_waits_and_goes_again(
    batch_env: Env,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = batch_env
    env.sim.configure(batch_phase_s=0.05)
    env.ctx = replace(env.ctx, settings=replace(env.ctx.settings, batch_queue_tokens="gpt-4o-mini=300"))
    original = AsyncBatches.create
    refusals: list[dict[str, Any]] = []

    async def refuse_once(self: AsyncBatches, **kwargs: Any) -> Any:
        if not refusals:
            refusals.append(kwargs)
            request = httpx2.Request("POST", env.sim.base_url + "/batches")
            raise openai.BadRequestError(
                "Enqueued token limit reached for gpt-4o-mini",
                response=httpx2.Response(400, request=request),
                body={"code": "token_limit_exceeded", "message": "Enqueued token limit reached", "param": None},
            )
        return await original(self, **kwargs)

    monkeypatch.setattr(AsyncBatches, "create", refuse_once)
    spec = env.shard(lines(12))
    submitted = asyncio.run(submit_batch(env.ctx, spec))
    # the first file was refused: the rest of the shard's files wait with it, holding nothing
    assert submitted.batches_created == 0 and submitted.batch_ids == []
    assert env.sim.call(lambda s: list(s.files)) == []
    assert _queue_left(env, 300, [(JOB, 0)]) == ([], 300)
    row = env.store.shard(JOB, 0)
    assert row is not None and row.batch_tries == {"0": 2} and row.batch_requeued == 1
    assert row.provider_id == f"QUEUED#{JOB}#0"
    assert env.store.arm_shard(JOB, 0, "token") is False  # the wait is the backoff, not a busy loop
    assert _run_shards(env, [spec])[0].done is True
    results, errors = env.outputs(spec)
    assert len(results) == 12 and errors == []
    metadata = env.sim.call(lambda s: [b.metadata for b in s.batches.values()])
    assert metadata[0] == {"job": JOB, "shard": "0", "part": "0", "try": "2"}
    assert _queue_left(env, 300, [(JOB, 0)]) == ([], 300)
