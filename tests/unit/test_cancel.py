"""The cancel core, with moto in-process and the simulator as the provider."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from moto import mock_aws
from sluice.contract import Summary
from sluice.merge.merge import load_manifest
from sluice.runners.cancel import JobNotFound, cancel_job
from sluice.runners.direct import run_direct
from sluice.send.engine import make_session
from sluice.shard.frame import ShardContext
from sluice.store.jobs import ItemState

from tests.conftest import request_line
from tests.unit.helpers.cancel import BUCKET, Aws


@pytest.fixture
def aws(simulator: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Aws]:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield Aws(simulator.base_url)


def job_status(aws: Aws, job_id: str) -> str | None:
    job = aws.store.job(job_id)
    return job.status if job else None


def no_provider() -> tuple[str, str]:
    raise AssertionError("a job with no open provider work must not need the API key")


def test_an_unknown_job_is_not_found(aws: Aws) -> None:
    with pytest.raises(JobNotFound):
        cancel_job(s3=aws.s3, store=aws.store, sfn=aws.sfn, job_id="nope", provider=no_provider)


def test_a_finished_job_is_left_as_it_is(aws: Aws) -> None:
    aws.store.claim_job("done-1", execution="x", bucket=BUCKET, key="inbox/done.jsonl", etag='"e"', started_at=1.0)
    aws.store.finish_job(Summary(job_id="done-1", status="FAILED", input="s3://b/inbox/done.jsonl", error="it broke"))
    report = cancel_job(s3=aws.s3, store=aws.store, sfn=aws.sfn, job_id="done-1", provider=no_provider)
    # what the job row kept of its summary
    assert report.already_finished and report.status == "FAILED" and report.summary == {"error": "it broke"}
    assert job_status(aws, "done-1") == "FAILED"
    assert "Contents" not in aws.s3.list_objects_v2(Bucket=BUCKET, Prefix="outbox/")


def test_cancelled_while_planning_writes_a_cancelled_summary(aws: Aws) -> None:
    execution = aws.execution()
    aws.store.claim_job(
        "early-1", execution=execution, bucket=BUCKET, key="inbox/early.jsonl", etag='"e"', started_at=1.0
    )
    report = cancel_job(
        s3=aws.s3, store=aws.store, sfn=aws.sfn, job_id="early-1", provider=no_provider, reason="wrong file"
    )

    assert report.status == "CANCELLED" and report.execution_stopped
    assert aws.sfn.describe_execution(executionArn=execution)["status"] == "ABORTED"
    summary = orjson.loads(aws.s3.get_object(Bucket=BUCKET, Key="outbox/early.summary.json")["Body"].read())
    assert summary["status"] == "CANCELLED" and "wrong file" in summary["error"]
    assert job_status(aws, "early-1") == "CANCELLED"


def test_direct_work_needs_no_provider_call_and_every_line_is_accounted_for(
    aws: Aws, simulator: Any, tmp_path: Path
) -> None:
    lines = [request_line(f"d-{n}") for n in range(12)]
    state = aws.plan("inbox/direct.jsonl", lines)
    first = load_manifest(aws.s3, BUCKET, state["manifest_key"])[0]
    ctx = ShardContext(aws.s3, aws.store, aws.settings, "sk-test", lambda: 900.0, make_session)
    asyncio.run(run_direct(ctx, first))
    simulator.clear_log()

    report = cancel_job(s3=aws.s3, store=aws.store, sfn=aws.sfn, job_id=state["job_id"], provider=no_provider)

    assert report.status == "CANCELLED" and not report.provider_failures
    assert simulator.log == []
    results = aws.read_lines("outbox/direct.results.jsonl")
    errors = aws.read_lines("outbox/direct.errors.jsonl")
    assert [r["custom_id"] for r in results] == [f"d-{n}" for n in range(5)]
    assert [e["custom_id"] for e in errors] == [f"d-{n}" for n in range(5, 12)]
    assert errors[0]["error"] == {
        "code": "cancelled",
        "message": "line 6: the job was cancelled before this line finished (cancelled by the user)",
    }
    assert (
        report.summary is not None
        and report.summary["counts"]["results"] == 5
        and report.summary["status"] == "CANCELLED"
    )


def test_a_cancel_marks_every_shard_so_a_run_still_starting_sends_nothing(aws: Aws, simulator: Any) -> None:
    state = aws.plan("inbox/marked.jsonl", [request_line(f"m-{n}") for n in range(12)])
    job_id = state["job_id"]
    cancel_job(s3=aws.s3, store=aws.store, sfn=aws.sfn, job_id=job_id, provider=no_provider)
    assert [aws.store.stop_mark(job_id, shard) for shard in range(3)] == ["CANCELLED"] * 3

    # a run the workflow started before the execution stopped reads its shard's mark first
    simulator.clear_log()
    spec = load_manifest(aws.s3, BUCKET, state["manifest_key"])[1]
    ctx = ShardContext(aws.s3, aws.store, aws.settings, "sk-test", lambda: 900.0, make_session)
    ran = asyncio.run(run_direct(ctx, spec))
    assert ran.cancelled and ran.sent == 0
    assert simulator.log == []


def test_a_cancel_the_provider_refuses_is_reported_and_the_job_still_ends(aws: Aws, simulator: Any) -> None:
    state = aws.plan("inbox/bg.jsonl", [request_line(f"b-{n}", url="/v1/responses") for n in range(3)])
    job_id = state["job_id"]
    aws.store.record_progress(
        job_id,
        0,
        [ItemState(2, "b-1", "submitted", provider_id="resp_unknown_to_the_provider")],
        done=0,
        failed=0,
        finished=False,
        run=1,
    )
    report = cancel_job(
        s3=aws.s3, store=aws.store, sfn=aws.sfn, job_id=job_id, provider=lambda: (simulator.base_url, "sk-test")
    )

    assert report.responses_cancelled == 0
    assert len(report.provider_failures) == 1
    assert report.provider_failures[0].startswith("resp_unknown_to_the_provider: HTTP 404")
    assert job_status(aws, job_id) == "CANCELLED"
    assert [e["error"]["code"] for e in aws.read_lines("outbox/bg.errors.jsonl")] == ["cancelled"] * 3


@contextmanager
def provider_that_refuses_cancels_of_finished_work() -> Iterator[str]:
    """What OpenAI does: 400 for cancelling a response that has completed; GET shows it completed."""

    async def cancel(request: web.Request) -> web.Response:
        error = {"message": "Cannot cancel a response with status completed.", "type": "invalid_request_error"}
        return web.json_response({"error": error}, status=400)

    async def get(request: web.Request) -> web.Response:
        return web.json_response({"id": request.match_info["id"], "object": "response", "status": "completed"})

    app = web.Application()
    app.router.add_post("/v1/responses/{id}/cancel", cancel)
    app.router.add_get("/v1/responses/{id}", get)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_a_refused_cancel_of_work_that_already_ended_is_not_a_failure(aws: Aws) -> None:
    state = aws.plan("inbox/late.jsonl", [request_line(f"l-{n}", url="/v1/responses") for n in range(2)])
    job_id = state["job_id"]
    settled = [ItemState(n, f"l-{n - 1}", "settled", provider_id=f"resp_{n}") for n in (1, 2)]
    aws.store.record_progress(job_id, 0, settled, done=0, failed=0, finished=False, run=1)
    with provider_that_refuses_cancels_of_finished_work() as base_url:
        report = cancel_job(s3=aws.s3, store=aws.store, sfn=aws.sfn, job_id=job_id, provider=lambda: (base_url, "k"))

    assert report.already_ended == 2 and report.responses_cancelled == 0
    assert report.provider_failures == []
    assert job_status(aws, job_id) == "CANCELLED"


def test_only_batches_that_have_not_ended_are_cancelled(aws: Aws) -> None:
    from sluice.runners.cancel import open_provider_work

    state = aws.plan("inbox/batches.jsonl", [request_line(f"x-{n}") for n in range(10)])
    job_id = state["job_id"]
    aws.store.set_shard_batches(job_id, 0, ["batch_a", "batch_b", "batch_c"])
    aws.store.mark_batch_collected(job_id, 0, "batch_a", {"status": "completed"})
    aws.store.set_shard_batches(job_id, 1, ["batch_d"])
    aws.store.settle_batch("batch_d", "completed")
    assert open_provider_work(aws.store, job_id).batches == ["batch_b", "batch_c"]


def test_files_still_waiting_for_room_in_the_batch_queue_are_no_batch_to_cancel(aws: Aws) -> None:
    from sluice.runners.cancel import open_provider_work

    state = aws.plan("inbox/queued.jsonl", [request_line(f"x-{n}") for n in range(10)])
    job_id = state["job_id"]
    aws.store.plan_batch_parts(job_id, 0, [{"model": "gpt-4o-mini", "tokens": 10, "lines": 5}] * 3)
    aws.store.set_shard_batches(job_id, 0, ["", "batch_b", ""])
    aws.store.mark_batch_collected(job_id, 0, "batch_b", {"status": "completed"})
    aws.store.plan_batch_parts(job_id, 1, [{"model": "gpt-4o-mini", "tokens": 10, "lines": 5}])
    aws.store.await_batch(job_id, 1, f"QUEUED#{job_id}#1")
    assert open_provider_work(aws.store, job_id).batches == []
    aws.store.set_shard_batches(job_id, 1, ["batch_e"])
    assert open_provider_work(aws.store, job_id).batches == ["batch_e"]


def test_a_failed_jobs_shards_stopped_holding_slots_give_them_back(aws: Aws) -> None:
    from sluice.contract import Planned
    from sluice.limits.shard_slots import SLOTS_KEY, ShardSlots, SlotPolicy
    from sluice.runners.cancel import stop_failed_job

    state = Planned.from_dict(aws.plan("inbox/failing.jsonl", [request_line(f"f-{n}") for n in range(12)]))
    slots = ShardSlots(aws.store.table, SlotPolicy(cap=4))
    # shards 0 and 2 ran when the Map failed: its children stop before their own give-back
    assert slots.take(state.job_id, 0).taken and slots.take(state.job_id, 2).taken

    asyncio.run(stop_failed_job(aws.store, state, lambda: pytest.fail("no open work to cancel")))

    assert int(aws.store.table.get_item(Key=SLOTS_KEY, ConsistentRead=True)["Item"]["inflight"]) == 0
    assert [row.slot_window for row in aws.store.shards(state.job_id)] == [None, None, None]
