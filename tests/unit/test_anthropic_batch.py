"""Anthropic's Message Batches as a `BatchApi` (`sluice.providers.anthropic.batch`), against the
simulator's Message Batches (`sluice_local.simulator.message_batches`)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from sluice.contract.model import ErrorCode, Request
from sluice.providers.anthropic import batch as batch_module
from sluice.providers.anthropic.batch import AnthropicBatchApi, ProviderUnavailable, opener
from sluice.providers.anthropic.batch_wire import batch_status, parse_row
from sluice.providers.anthropic.format import ANTHROPIC
from sluice.providers.batch import BatchRow, BatchState, BatchStatus, BatchTag, QueueFull

from sluice_local.simulator import SimConfig, SimulatorServer
from tests.unit import batch_runs
from tests.unit.batch_runs import until_ended

BASE = SimConfig(latency_s=0.0, seed=7, batch_phase_s=0.0)
MODEL = "claude-3-5-haiku-latest"
TAG = BatchTag("reviews-0123456789ab", 3, 1)
ID_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(BASE) as running:
        yield running


@pytest.fixture
def sim(server: SimulatorServer) -> SimulatorServer:
    server.reset()
    server.configure(**dataclasses.asdict(BASE))
    return server


chat = functools.partial(batch_runs.chat, ANTHROPIC, MODEL)
responses = functools.partial(batch_runs.responses, ANTHROPIC, MODEL)
upload = functools.partial(batch_runs.upload, MODEL)


def native(line: int, custom_id: str) -> Request:
    body = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "positive or negative: great"}]}
    return Request(line, custom_id, "POST", "/v1/messages", orjson.dumps(body))


def run_batch(sim: SimulatorServer, requests: list[Request]) -> tuple[BatchStatus, list[BatchRow]]:
    return batch_runs.run_batch(opener(sim.url, "sk-ant-test", timeout_s=5.0), MODEL, TAG, requests)


def test_a_batch_answers_chat_lines_as_chat_completions_and_native_lines_natively(sim: SimulatorServer) -> None:
    user_ids = ["avis-client-é€-" + "x" * 85, "ünïcødé id", "native"]
    requests = [chat(7, user_ids[0]), chat(8, user_ids[1], "awful"), native(9, user_ids[2])]

    status, rows = run_batch(sim, requests)

    assert status.state == BatchState.COMPLETED and status.counts.completed == 3
    sent = sim.call(lambda s: [[r.custom_id for r in b.requests] for b in s.message_batches.batches.values()])
    assert all(ID_PATTERN.match(custom_id) for custom_id in sent[0])
    api = AnthropicBatchApi.__new__(AnthropicBatchApi)
    by_ref = {row.ref: row for row in rows}
    assert set(by_ref) == {api.row_ref(r.line, r.custom_id) for r in requests}
    first, second, third = (by_ref[api.row_ref(r.line, r.custom_id)] for r in requests)
    assert first.status_code == 200 and first.error_code is None
    assert first.body["object"] == "chat.completion"
    assert first.body["choices"][0]["message"]["content"] == "positive"
    assert second.body["choices"][0]["message"]["content"] == "negative"
    assert first.body["usage"]["total_tokens"] > 0
    assert third.body["type"] == "message" and third.body["content"] == [{"type": "text", "text": "positive"}]


def test_a_batch_answers_responses_lines_as_responses(sim: SimulatorServer) -> None:
    requests = [responses(3, "r/1"), responses(4, "r/2", "awful")]

    status, rows = run_batch(sim, requests)

    assert status.state == BatchState.COMPLETED and status.counts.completed == 2
    sent = sim.call(lambda s: [[r.custom_id for r in b.requests] for b in s.message_batches.batches.values()])
    assert [custom_id[-2:] for custom_id in sent[0]] == ["3r", "4r"]
    first, second = sorted(rows, key=lambda row: row.ref)
    assert first.ref == "3" and first.status_code == 200
    assert first.body["object"] == "response" and first.body["status"] == "completed"
    assert first.body["output"][0]["content"] == [{"type": "output_text", "text": "positive", "annotations": []}]
    assert second.body["output"][0]["content"][0]["text"] == "negative"
    usage = first.body["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0


@pytest.mark.parametrize("relative", [True, False], ids=["a path", "a whole URL"])
@pytest.mark.parametrize("base", ["", "/v1", "/v1/"], ids=["bare", "v1", "v1 slash"])
def test_a_results_url_is_read_against_the_providers_base(sim: SimulatorServer, relative: bool, base: str) -> None:
    sim.configure(relative_results_url=relative)

    async def go() -> tuple[BatchStatus, list[BatchRow]]:
        async with opener(sim.url + base, "sk-ant-test", timeout_s=5.0)() as api:
            assert isinstance(api, AnthropicBatchApi)
            batch_id = await api.submit(upload(api, [native(1, "a"), native(2, "b")]), TAG)
            status = await until_ended(api, batch_id)
            return status, [row async for row in api.rows(status)]

    status, rows = asyncio.run(go())

    assert (status.output_file or "").startswith("/v1/" if relative else "http")
    assert sorted(row.ref for row in rows) == ["1", "2"] and all(row.status_code == 200 for row in rows)


def test_an_expired_batch_keeps_its_answers_and_names_the_rest_unfinished(sim: SimulatorServer) -> None:
    sim.configure(batch_expire_fraction=1.0, batch_expire_done_fraction=0.5)
    requests = [chat(n, f"c-{n}", f"review {n}") for n in range(1, 41)]

    status, rows = run_batch(sim, requests)

    assert status.state == BatchState.EXPIRED
    answered = [row for row in rows if not row.unfinished]
    left = [row for row in rows if row.unfinished]
    assert answered and left and len(answered) + len(left) == 40
    assert {row.error_code for row in left} == {ErrorCode.BATCH_EXPIRED}
    assert all(row.body["object"] == "chat.completion" for row in answered)
    assert status.counts.completed == len(answered) and status.counts.failed == len(left)


def test_errored_requests_come_back_as_provider_errors(sim: SimulatorServer) -> None:
    sim.configure(batch_row_error_rate=1.0)
    bad = Request(2, "bad", "POST", "/v1/messages", orjson.dumps({"model": MODEL, "messages": []}))

    _, rows = run_batch(sim, [native(1, "ok"), bad])

    by_ref = {row.ref: row for row in rows}
    assert by_ref["1"].status_code == 500 and by_ref["1"].error_code == ErrorCode.PROVIDER_ERROR
    assert "api_error" in (by_ref["1"].error_message or "")
    assert by_ref["2"].status_code == 400 and "invalid_request_error" in (by_ref["2"].error_message or "")
    assert not any(row.unfinished for row in rows)


def test_find_recognises_an_ended_batch_of_the_shard_from_its_results(sim: SimulatorServer) -> None:
    async def go() -> tuple[dict[BatchTag, str], dict[BatchTag, str], str, list[Any]]:
        async with opener(sim.url, "sk-ant-test", timeout_s=5.0)() as api:
            assert isinstance(api, AnthropicBatchApi)
            batch_id = await api.submit(upload(api, [native(1, "a"), native(2, "b")]), TAG)
            await until_ended(api, batch_id)
        # a run that died before recording the batch: a new process, which never saw it created
        async with opener(sim.url, "sk-ant-test", timeout_s=5.0)() as fresh:
            mine = await fresh.find(TAG.job, TAG.shard, since=0.0)
            other = await fresh.find(TAG.job, TAG.shard + 1, since=0.0)
            listed = await fresh.listed(since=0.0)
        return mine, other, batch_id, listed

    mine, other, batch_id, listed = asyncio.run(go())

    assert mine == {TAG: batch_id}
    assert other == {}
    assert [status.id for status in listed] == [batch_id]


def shift(batch: Any, seconds: float) -> None:
    """Move a simulated batch `seconds` into its past."""
    batch.t0 -= seconds
    batch.cancel_t -= seconds


def test_a_cancelled_batch_ends_with_its_unrun_requests_unfinished(sim: SimulatorServer) -> None:
    sim.configure(batch_phase_s=60.0)

    async def go() -> tuple[BatchStatus, BatchStatus, list[BatchRow], list[str]]:
        async with opener(sim.url, "sk-ant-test", timeout_s=5.0)() as api:
            assert isinstance(api, AnthropicBatchApi)
            batch_id = await api.submit(upload(api, [native(n, f"n{n}") for n in range(1, 6)]), TAG)
            cancelling = await api.cancel(batch_id)
            # the simulator ends a cancel one phase later: a phase passes now
            sim.call(lambda s: shift(s.message_batches.batches[batch_id], 60.0))
            ended = await api.status(batch_id)
            rows = [row async for row in api.rows(ended)]
            await api.clean_up([ended])
            deleted = sim.call(lambda s: list(s.message_batches.deleted))
            return cancelling, ended, rows, deleted

    cancelling, ended, rows, deleted = asyncio.run(go())

    assert cancelling.state == BatchState.CANCELLING
    assert ended.state == BatchState.CANCELLED
    assert len(rows) == 5 and {row.error_code for row in rows} == {ErrorCode.BATCH_CANCELLED}
    assert all(row.unfinished for row in rows)
    assert deleted == [ended.id]


def test_message_batches_refuse_an_id_outside_the_pattern_which_sluice_never_sends(sim: SimulatorServer) -> None:
    async def go() -> tuple[int, Any]:
        async with opener(sim.url, "sk-ant-test", timeout_s=5.0)() as api:
            assert isinstance(api, AnthropicBatchApi)
            params = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            body = orjson.dumps({"requests": [{"custom_id": "ünïcødé id", "params": params}]})
            answer = await api._once("POST", api._url, data=body)
            return answer.status, answer.body

    status, body = asyncio.run(go())

    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "custom_id" in body["error"]["message"]


def test_listed_walks_every_page_newest_first(sim: SimulatorServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_module, "PAGE", 2)

    async def go() -> tuple[list[str], list[str]]:
        async with opener(sim.url, "sk-ant-test", timeout_s=5.0)() as api:
            assert isinstance(api, AnthropicBatchApi)
            created = [
                await api.submit(upload(api, [native(1, "a")]), BatchTag(TAG.job, TAG.shard, part)) for part in range(5)
            ]
            return created, [status.id for status in await api.listed(since=0.0)]

    created, listed = asyncio.run(go())

    assert listed == created[::-1]


class LosesCreateAnswers(AnthropicBatchApi):
    """A connection that drops the answer to the first `lost` creates, after the batch exists;
    `meanwhile` runs once the batches before the create were listed (another shard's create)."""

    def __init__(self, api: AnthropicBatchApi, lost: int, meanwhile: Callable[[], Awaitable[object]] | None = None):
        self.__dict__.update(api.__dict__)
        self.lost = lost
        self.meanwhile = meanwhile

    async def _newest(self, since: float) -> set[str]:
        before = await super()._newest(since)
        if self.meanwhile is not None:
            await self.meanwhile()
        return before

    async def _once(self, method: str, url: str, *, data: bytes | bytearray | None = None, **options: Any) -> Any:
        answer = await super()._once(method, url, data=data, **options)
        if method == "POST" and url.endswith("/batches") and self.lost:
            self.lost -= 1
            raise aiohttp.ServerDisconnectedError()
        return answer


def test_a_create_whose_answer_was_lost_takes_the_batch_it_created_instead_of_paying_twice(
    sim: SimulatorServer,
) -> None:
    async def go() -> tuple[str, dict[BatchTag, str]]:
        async with opener(sim.url, "sk-ant-test", timeout_s=5.0)() as opened:
            assert isinstance(opened, AnthropicBatchApi)
            api = LosesCreateAnswers(opened, lost=1)
            batch_id = await api.submit(upload(api, [native(1, "a"), native(2, "b")]), TAG)
            return batch_id, await api.find(TAG.job, TAG.shard, since=0.0)

    batch_id, found = asyncio.run(go())

    assert sim.call(lambda s: list(s.message_batches.batches)) == [batch_id]
    assert found == {TAG: batch_id}


def test_a_lost_create_that_cannot_tell_its_batch_from_anothers_raises_rather_than_guess(
    sim: SimulatorServer,
) -> None:
    async def go() -> None:
        async with opener(sim.url, "sk-ant-test", timeout_s=5.0)() as opened:
            assert isinstance(opened, AnthropicBatchApi)
            other = BatchTag(TAG.job, TAG.shard + 1, 0)

            async def another_shard_creates() -> str:
                return await opened.submit(upload(opened, [native(1, "x"), native(2, "y")]), other)

            api = LosesCreateAnswers(opened, lost=1, meanwhile=another_shard_creates)
            await api.submit(upload(api, [native(1, "a"), native(2, "b")]), TAG)

    with pytest.raises(ProviderUnavailable, match="2 batches of 2 requests appeared"):
        asyncio.run(go())
    assert len(sim.call(lambda s: list(s.message_batches.batches))) == 2


def message_batch(**fields: Any) -> dict[str, Any]:
    counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    counts.update(fields.pop("counts", {}))
    return {
        "id": "msgbatch_1",
        "type": "message_batch",
        "processing_status": "ended",
        "request_counts": counts,
        "created_at": "2026-01-01T00:00:00.5Z",
        "ended_at": "2026-01-01T01:00:00Z",
        "cancel_initiated_at": None,
        "results_url": "https://api.anthropic.com/v1/messages/batches/msgbatch_1/results",
        **fields,
    }


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({"processing_status": "in_progress", "counts": {"processing": 3}, "ended_at": None}, BatchState.IN_PROGRESS),
        ({"processing_status": "canceling", "counts": {"processing": 3}}, BatchState.CANCELLING),
        ({"counts": {"succeeded": 2, "errored": 1}}, BatchState.COMPLETED),
        ({"counts": {"succeeded": 2, "expired": 1}}, BatchState.EXPIRED),
        (
            {"counts": {"succeeded": 2, "canceled": 1}, "cancel_initiated_at": "2026-01-01T00:30:00Z"},
            BatchState.CANCELLED,
        ),
    ],
)
def test_a_message_batch_reads_in_openais_words(fields: dict[str, Any], state: str) -> None:
    status = batch_status(message_batch(**fields))

    assert status.state == state
    assert status.created_at == pytest.approx(1767225600.5)
    assert status.ended_at == (None if state in (BatchState.IN_PROGRESS, BatchState.CANCELLING) else 1767229200.0)
    assert status.counts.total == 3


def test_results_lines_that_are_not_sluices_rows_are_skipped() -> None:
    message = {"type": "message", "content": [], "usage": {}}
    assert parse_row({"custom_id": "someone-elses", "result": {"type": "succeeded", "message": message}}, 0) is None
    assert parse_row({"custom_id": "0123456789ab-0-1-7m", "result": "mangled"}, 0) is None
    row = parse_row({"custom_id": "0123456789ab-0-1-7m", "result": {"type": "succeeded", "message": message}}, 0)
    assert row is not None and (row.ref, row.status_code, row.body) == ("7", 200, message)


def test_a_batch_the_full_queue_refuses_is_queue_full_and_leaves_nothing_behind(sim: SimulatorServer) -> None:
    async def go() -> str:
        async with opener(sim.url, "sk-ant-test", timeout_s=5.0)() as api:
            assert isinstance(api, AnthropicBatchApi)
            first = await api.submit(upload(api, [native(1, "a")]), TAG)
            with pytest.raises(QueueFull, match="HTTP 429"):
                await api.submit(upload(api, [native(2, "b")]), BatchTag(TAG.job, TAG.shard, 2))
            return first

    sim.configure(batch_phase_s=60.0, batch_queue_limit=30)
    first = asyncio.run(go())

    assert sim.call(lambda s: list(s.message_batches.batches)) == [first]
    refused = [e for e in sim.log if e["method"] == "POST" and e["status"] == 429]
    assert len(refused) == 1
