"""Gemini's Batch API as a `BatchApi` (`sluice.providers.gemini.batch`), against the simulator's
(`sluice_local.simulator.gemini_batches`): requests inline or as a Files API upload, answers matched back by
key and translated to their lines' shape, an expired batch's partial output, a cancel, a failed
batch, a full queue, and the batches a lost answer or a dead run hid found by their tag."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import Any

import pytest
from sluice.contract.model import ErrorCode, Request
from sluice.providers.batch import BatchRow, BatchState, BatchStatus, BatchTag, QueueFull
from sluice.providers.gemini import GEMINI
from sluice.providers.gemini import batch as batch_module
from sluice.providers.gemini.batch import GeminiBatchApi, opener
from sluice.providers.gemini.batch_wire import batch_status, parse_row

from sluice_local.simulator import SimulatorServer
from tests.unit import batch_runs

MODEL = "gemini-2.5-flash"
TAG = BatchTag("reviews-0123456789ab", 3, 1)
KEY = "gemini-test-key"


@pytest.fixture
def sim(simulator: SimulatorServer) -> SimulatorServer:
    """The shared simulator, its batches ending at once unless a test slows them."""
    simulator.configure(latency_s=0.0, batch_phase_s=0.0)
    return simulator


chat = functools.partial(batch_runs.chat, GEMINI, MODEL)
responses = functools.partial(batch_runs.responses, GEMINI, MODEL)
upload = functools.partial(batch_runs.upload, MODEL)


def run_batch(sim: SimulatorServer, requests: list[Request]) -> tuple[BatchStatus, list[BatchRow]]:
    return batch_runs.run_batch(opener(sim.url, KEY, timeout_s=5.0), MODEL, TAG, requests)


def batches(sim: SimulatorServer) -> list[Any]:
    return sim.call(lambda s: list(s.gemini_batches.batches.values()))


@pytest.mark.parametrize("as_file", [False, True], ids=["inline", "a Files API upload"])
def test_a_batch_answers_each_line_in_its_shape_matched_by_key(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch, as_file: bool
) -> None:
    if as_file:
        # a part past the inline limit goes as a JSONL file: the limit made small, not the part large
        monkeypatch.setattr(batch_module, "INLINE_MAX_BYTES", 200)
    requests = [chat(7, "c-7"), chat(8, "c-8", "awful"), responses(9, "r-9")]

    status, rows = run_batch(sim, requests)

    assert status.state == BatchState.COMPLETED
    assert status.counts.total == 3 and status.counts.completed == 3
    sent = batches(sim)
    assert len(sent) == 1 and sent[0].inline is not as_file
    assert sent[0].display_name == "sluice/reviews-0123456789ab/3/1/1"
    assert (status.output_file or "").startswith("files/") is as_file
    by_ref = {row.ref: row for row in rows}
    assert set(by_ref) == {"7", "8", "9"}
    assert by_ref["7"].status_code == 200 and by_ref["7"].error_code is None
    assert by_ref["7"].body["object"] == "chat.completion"
    assert by_ref["7"].body["choices"][0]["message"]["content"] == "positive"
    assert by_ref["8"].body["choices"][0]["message"]["content"] == "negative"
    assert by_ref["7"].body["usage"]["total_tokens"] > 0
    assert by_ref["9"].body["object"] == "response"
    assert by_ref["9"].body["output"][0]["content"][0]["text"] == "positive"


def test_an_expired_batch_keeps_the_answers_it_gave_and_leaves_the_rest_out(sim: SimulatorServer) -> None:
    sim.configure(batch_expire_fraction=1.0, batch_expire_done_fraction=0.5)
    requests = [chat(n, f"c-{n}", f"review {n}") for n in range(1, 41)]

    status, rows = run_batch(sim, requests)

    assert status.state == BatchState.EXPIRED and status.ended_at is not None
    # the rows it never ran are absent: the runner names them from the batch's state
    assert 0 < len(rows) < 40
    assert all(row.status_code == 200 and row.body["object"] == "chat.completion" for row in rows)
    assert status.counts.completed == len(rows)


def test_a_request_the_batch_could_not_answer_is_that_lines_provider_error(sim: SimulatorServer) -> None:
    sim.configure(batch_row_error_rate=1.0)

    status, rows = run_batch(sim, [chat(1, "a"), chat(2, "b")])

    assert status.state == BatchState.COMPLETED
    assert {row.ref for row in rows} == {"1", "2"}
    for row in rows:
        assert row.status_code == 500 and row.error_code == ErrorCode.PROVIDER_ERROR
        assert "Internal error" in (row.error_message or "")
        assert not row.unfinished


def test_a_cancelled_batch_ends_cancelled_and_its_files_are_deleted(sim: SimulatorServer) -> None:
    sim.configure(batch_phase_s=60.0)

    async def go() -> tuple[BatchStatus, BatchStatus, list[BatchRow], int]:
        async with opener(sim.url, KEY, timeout_s=5.0)() as api:
            assert isinstance(api, GeminiBatchApi)
            batch_id = await api.submit(upload(api, [chat(n, f"n{n}") for n in range(1, 6)]), TAG)
            cancelling = await api.cancel(batch_id)

            def shift(s: Any) -> None:
                # the simulator ends a cancel a phase later: a phase passes now
                batch = s.gemini_batches.batches[batch_id.removeprefix("batches/")]
                batch.t0 -= 60.0
                batch.cancel_t -= 60.0

            sim.call(shift)
            ended = await api.status(batch_id)
            rows = [row async for row in api.rows(ended)]
            await api.clean_up([ended])
            return cancelling, ended, rows, len(batches(sim))

    cancelling, ended, rows, left = asyncio.run(go())

    assert cancelling.state == BatchState.CANCELLING
    assert ended.state == BatchState.CANCELLED and ended.censored_turnaround_s is not None
    # cancelled while pending: nothing ran, so nothing is answered
    assert rows == []
    assert left == 0


def test_a_batch_that_failed_says_why(sim: SimulatorServer) -> None:
    sim.configure(batch_validation_error=True)

    status, rows = run_batch(sim, [chat(1, "a")])

    assert status.state == BatchState.FAILED
    assert rows == []
    assert status.problems and status.problems[0].message


def test_a_full_queue_is_queue_full_and_leaves_nothing_behind(sim: SimulatorServer) -> None:
    sim.configure(batch_queue_limit=1)

    async def go() -> None:
        async with opener(sim.url, KEY, timeout_s=5.0)() as api:
            assert isinstance(api, GeminiBatchApi)
            await api.submit(upload(api, [chat(1, "a")]), TAG)

    with pytest.raises(QueueFull, match="RESOURCE_EXHAUSTED"):
        asyncio.run(go())
    assert batches(sim) == []


def test_find_and_listed_know_the_shards_batches_by_their_tag(sim: SimulatorServer) -> None:
    async def go() -> tuple[str, str, dict[BatchTag, str], dict[BatchTag, str], list[BatchStatus]]:
        async with opener(sim.url, KEY, timeout_s=5.0)() as api:
            assert isinstance(api, GeminiBatchApi)
            first = await api.submit(upload(api, [chat(1, "a")]), TAG)
            again = dataclasses.replace(TAG, attempt=2)
            second = await api.submit(upload(api, [chat(1, "a")]), again)
        # a run that died before recording them: a new process, which never saw them created
        async with opener(sim.url, KEY, timeout_s=5.0)() as fresh:
            mine = await fresh.find(TAG.job, TAG.shard, since=0.0)
            other = await fresh.find(TAG.job, TAG.shard + 1, since=0.0)
            listed = await fresh.listed(since=0.0)
        return first, second, mine, other, listed

    first, second, mine, other, listed = asyncio.run(go())

    assert mine == {TAG: first, dataclasses.replace(TAG, attempt=2): second}
    assert other == {}
    assert {status.id: status.tag for status in listed} == {first: TAG, second: dataclasses.replace(TAG, attempt=2)}


def test_a_create_whose_answer_was_lost_takes_the_batch_it_created(
    sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    class LosesFirstAnswer(GeminiBatchApi):
        lost = False

        async def _once(self, method: str, url: str, **options: Any) -> Any:
            answer = await super()._once(method, url, **options)
            if url.endswith(":batchGenerateContent") and not self.lost:
                self.lost = True
                raise TimeoutError("the answer was lost on the way back")
            return answer

    async def go() -> str:
        async with opener(sim.url, KEY, timeout_s=5.0)() as api:
            assert isinstance(api, GeminiBatchApi)
            lossy = LosesFirstAnswer(api._session, sim.url, api.limits)
            return await lossy.submit(upload(lossy, [chat(1, "a")]), TAG)

    monkeypatch.setattr(batch_module.asyncio, "sleep", _no_sleep)
    batch_id = asyncio.run(go())

    made = batches(sim)
    assert len(made) == 1 and batch_id == f"batches/{made[0].id}"


async def _no_sleep(_: float) -> None:
    return None


def test_a_batch_reads_in_openais_words() -> None:
    operation: dict[str, Any] = {
        "name": "batches/b1",
        "metadata": {
            "state": "BATCH_STATE_RUNNING",
            "displayName": "sluice/job-1/0/2/1",
            "createTime": "2026-01-01T00:00:00.123456789Z",
            "batchStats": {"requestCount": "3", "successfulRequestCount": "1", "failedRequestCount": "0"},
        },
    }
    status = batch_status(operation)
    assert status.id == "batches/b1" and status.state == BatchState.IN_PROGRESS
    assert status.tag == BatchTag("job-1", 0, 2, 1)
    assert status.counts.total == 3 and status.counts.completed == 1
    assert status.created_at == pytest.approx(1_767_225_600.123456)
    assert batch_status({**operation, "metadata": {**operation["metadata"], "state": "BATCH_STATE_EXPIRED"}}).ended


def test_answers_that_are_not_sluices_rows_are_skipped() -> None:
    assert parse_row({"key": "someone-else", "response": {}}, 0, MODEL) is None
    assert parse_row({"metadata": {"key": "4c"}}, 0, MODEL) is None
    row = parse_row({"metadata": {"key": "4c"}, "error": {"code": 3, "message": "bad"}}, 0, MODEL)
    assert row is not None and row.ref == "4" and row.status_code == 400
