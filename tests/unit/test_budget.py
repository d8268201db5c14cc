"""The spending cap's arithmetic: worst cases, chunked reservations, settling, and the stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.contract import parse_budget
from sluice.contract.model import Outcome, Request
from sluice.limits.budget import (
    CHUNK_REQUESTS,
    DEFAULT_OUTPUT_TOKENS,
    HOLDERS_POLL_MAX_S,
    HOLDERS_READS_PER_S,
    Budget,
    BudgetState,
    actual_nano,
    holders_poll_s,
    usd_to_nano,
    worst_case_nano,
)
from sluice.providers import OPENAI
from sluice.store.jobs import JobStore

from sluice_local.cloud import create_table
from tests.conftest import plan_figures

MINI = (0.15, 0.60)  # gpt-4o-mini, USD per million tokens


def chat(line: int, **body: Any) -> Request:
    payload = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 400}], **body}
    return Request(line, f"c{line}", "POST", "/v1/chat/completions", orjson.dumps(payload))


def answer(request: Request, tokens_in: int, tokens_out: int, model: str = "gpt-4o-mini-2024-07-18") -> Outcome:
    body = {"model": model, "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out}}
    return Outcome(request.line, request.custom_id, 200, body, None)


def nano(tokens_in: int, tokens_out: int) -> int:
    return round(tokens_in * MINI[0] * 1000 + tokens_out * MINI[1] * 1000)


class Ledger:
    """The job row's figures, with DynamoDB's conditional ADD, counting writes and reads."""

    def __init__(self) -> None:
        self.committed = 0
        self.spent = 0
        self.holders = 0
        self.writes = 0
        # when each read of the figures came (the event loop's clock)
        self.reads: list[float] = []

    def reserve_budget(self, job_id: str, amount: int, cap: int, spent: int, *, join: bool) -> BudgetState | None:
        self.writes += 1
        if self.committed > cap - amount:
            return None
        self.committed += amount
        self.spent += spent
        self.holders += join
        return BudgetState(self.committed, self.holders)

    def budget_state(self, job_id: str) -> BudgetState:
        self.reads.append(time.monotonic())
        return BudgetState(self.committed, self.holders)

    def release_budget(self, job_id: str, amount: int, spent: int, *, leave: bool) -> BudgetState:
        self.writes += 1
        self.committed += amount
        self.spent += spent
        self.holders -= leave
        return BudgetState(self.committed, self.holders)


def test_worst_case_is_the_body_at_four_bytes_a_token_plus_the_output_cap() -> None:
    request = chat(1, max_tokens=100)
    tokens_in = -(-len(request.body or b"") // 4)
    assert worst_case_nano(request, OPENAI) == nano(tokens_in, 100)
    assert worst_case_nano(request, OPENAI, batch=True) == -(-nano(tokens_in, 100) // 2)
    # max_completion_tokens wins over the legacy max_tokens; n answers cost n times
    assert worst_case_nano(chat(1, max_completion_tokens=10, max_tokens=500), OPENAI) == nano(
        -(-len(chat(1, max_completion_tokens=10, max_tokens=500).body or b"") // 4), 10
    )
    two = chat(1, max_tokens=100, n=2)
    assert worst_case_nano(two, OPENAI) == nano(-(-len(two.body or b"") // 4), 200)
    bare = chat(1)
    assert worst_case_nano(bare, OPENAI) == nano(-(-len(bare.body or b"") // 4), DEFAULT_OUTPUT_TOKENS)


def test_a_model_with_no_price_cannot_be_estimated() -> None:
    with pytest.raises(KeyError):
        worst_case_nano(chat(1, model="my-finetune"), OPENAI)


def test_an_answer_costs_its_usage_a_failure_nothing_and_an_answer_without_usage_its_reservation() -> None:
    request = chat(1, max_tokens=100)
    assert actual_nano(answer(request, 120, 7), "gpt-4o-mini", 999, OPENAI) == nano(120, 7)
    failed = Outcome(1, "c1", 500, None, None, error_code="retries_exhausted")
    assert actual_nano(failed, "gpt-4o-mini", 999, OPENAI) == 0
    queued = Outcome(1, "c1", 200, {"id": "resp_1", "status": "queued", "usage": None}, None)
    assert actual_nano(queued, "gpt-4o-mini", 999, OPENAI) == 999
    responses = Outcome(1, "c1", 200, {"model": "gpt-4o", "usage": {"input_tokens": 10, "output_tokens": 2}}, None)
    assert actual_nano(responses, "gpt-4o-mini", 999, OPENAI) == round(10 * 2.5 * 1000 + 2 * 10.0 * 1000)


def test_budgets_are_dollars_above_zero() -> None:
    assert parse_budget("12.5") == 12.5
    for bad in ("0", "-1", "nan", "inf", "ten"):
        with pytest.raises(ValueError, match="US dollars"):
            parse_budget(bad)


def test_a_shard_reserves_in_chunks_and_gives_back_what_answers_did_not_use() -> None:
    ledger = Ledger()
    budget = Budget(ledger, "job", usd_to_nano(1.0), request_format=OPENAI)
    request = chat(1, max_tokens=100)
    need = worst_case_nano(request, OPENAI)

    async def one(line: int) -> None:
        req = chat(line, max_tokens=100)
        assert await budget.reserve(req)
        budget.settle(req, answer(req, 50, 10))

    async def many() -> None:
        for line in range(1, 101):
            await one(line)

    asyncio.run(many())
    # the first chunk covers CHUNK_REQUESTS worst cases; refunds keep the pool topped up
    assert ledger.writes == 1
    assert ledger.committed == need * CHUNK_REQUESTS
    assert budget.spent == 100 * nano(50, 10)
    budget.close()
    # back at the row: exactly what the answers cost
    assert ledger.committed == ledger.spent == 100 * nano(50, 10)
    assert ledger.writes == 2


def test_the_stop_comes_within_one_request_of_the_cap_across_shards() -> None:
    ledger = Ledger()
    request = chat(1, max_tokens=100)
    need = worst_case_nano(request, OPENAI)
    cost = nano(90, 100)  # each answer uses most of its worst case
    cap = 37 * need + need // 3
    shards = [Budget(ledger, "job", cap, request_format=OPENAI) for _ in range(3)]
    sent = [0, 0, 0]

    async def shard(index: int) -> None:
        budget = shards[index]
        for line in range(index * 1000, index * 1000 + 1000):
            req = chat(line, max_tokens=100)
            if not await budget.reserve(req):
                break
            await asyncio.sleep(0)
            budget.settle(req, answer(req, 90, 100))
            sent[index] += 1
        await asyncio.to_thread(budget.close)

    async def run() -> None:
        await asyncio.gather(*(shard(i) for i in range(3)))

    asyncio.run(run())
    spent = sum(sent) * cost
    assert all(b.exhausted for b in shards)
    assert ledger.spent == spent == ledger.committed
    assert cap - need < spent <= cap
    # a write per chunk, and a few per shard as it stops (the refused ask, joining the wait, the
    # last ask, leaving the wait, the release), not one per request
    assert ledger.writes <= sum(sent) // CHUNK_REQUESTS + 5 * len(shards)


def test_a_chunk_the_last_figures_leave_no_room_for_is_not_asked() -> None:
    """At the end of a job's budget every shard would ask for a chunk the cap refuses, all at once:
    a refused conditional write costs a write unit like a granted one. A shard whose last write
    says a chunk no longer fits goes straight to the end's wait, and still spends to the cap."""
    ledger = Ledger()
    request = chat(1, max_tokens=100)
    need = worst_case_nano(request, OPENAI)
    cap = need * CHUNK_REQUESTS * 3 // 2
    budget = Budget(ledger, "job", cap, request_format=OPENAI)

    async def run() -> int:
        sent = 0
        for line in range(10 * CHUNK_REQUESTS):
            req = chat(line, max_tokens=100)
            if not await budget.reserve(req):
                break
            budget.settle(req, answer(req, 100, 100))
            sent += 1
        return sent

    sent = asyncio.run(run())
    budget.close()
    assert budget.exhausted and budget.figures.refused == 0
    assert cap - need < ledger.spent == sent * nano(100, 100) <= cap
    assert ledger.committed == ledger.spent


def test_a_request_bigger_than_what_is_left_is_not_sent() -> None:
    ledger = Ledger()
    small, big = chat(1, max_tokens=10), chat(2, max_tokens=5000)
    budget = Budget(ledger, "job", worst_case_nano(small, OPENAI) * 2, request_format=OPENAI)

    async def run() -> tuple[bool, bool]:
        return await budget.reserve(big), budget.exhausted

    assert asyncio.run(run()) == (False, True)
    budget.close()
    assert ledger.committed == 0


@pytest.fixture
def store() -> Iterator[JobStore]:
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        store = JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table("jobs"), ttl_days=1)
        store.claim_job("job", execution="e", bucket="b", key="k", etag="t", started_at=0.0)
        store.record_plan("job", plan=plan_figures(1), shards=[(0, 1, 1)], mode="direct", budget_cap=1000)
        yield store


def test_the_job_row_refuses_a_reservation_past_its_cap(store: JobStore) -> None:
    assert store.reserve_budget("job", 600, 1000, 0, join=True)
    assert not store.reserve_budget("job", 401, 1000, 5, join=True)
    assert store.reserve_budget("job", 400, 1000, 7, join=False)
    assert store.budget_state("job") == (1000, 1)
    # a refused shard hands its pool back and waits; the write says what it left
    assert store.release_budget("job", -300, 2, leave=True) == (700, 0)
    assert store.reserve_budget("job", 100, 1000, 0, join=True)
    # the row parses strictly: a figure the store no longer keeps (`budget_waiters`) would refuse it
    job = store.job("job")
    assert job is not None
    assert (job.budget_cap, job.budget_committed, job.budget_spent, job.budget_holders) == (1000, 800, 9, 1)


def test_a_refused_shard_waits_for_the_pool_a_finishing_shard_hands_back() -> None:
    ledger = Ledger()
    need = worst_case_nano(chat(1, max_tokens=100), OPENAI)
    cap = 60 * need
    small, large = Budget(ledger, "job", cap, request_format=OPENAI), Budget(ledger, "job", cap, request_format=OPENAI)
    sent = {"small": 0, "large": 0}

    async def shard(budget: Budget, name: str, lines: int, pause: float, latency: float) -> None:
        await asyncio.sleep(pause)
        for line in range(lines):
            req = chat(line, max_tokens=100)
            if not await budget.reserve(req):
                break
            await asyncio.sleep(latency)
            # answers use a tenth of their worst case: the small shard's chunk is mostly refunds
            budget.settle(req, answer(req, 9, 10))
            sent[name] += 1
        await asyncio.to_thread(budget.close)

    async def run() -> None:
        # the small shard holds its chunk for a while: the large one runs dry before it is back
        await asyncio.gather(shard(small, "small", 5, 0.0, 0.1), shard(large, "large", 10_000, 0.01, 0.001))

    asyncio.run(run())
    cost = nano(9, 10)
    assert sent["small"] == 5 and large.exhausted
    assert ledger.committed == ledger.spent == (sent["small"] + sent["large"]) * cost
    assert cap - need < ledger.spent <= cap


def test_the_wait_for_the_others_pools_reads_the_job_row_at_a_rate_bounded_whatever_the_shard_count() -> None:
    for waiters in (1, 10, 100, 1_000):
        # the mean of the jitter is 1: every waiting shard together reads the row this often a second
        mean = holders_poll_s(waiters, lambda: 0.5)
        assert waiters / mean <= HOLDERS_READS_PER_S or mean == HOLDERS_POLL_MAX_S
        assert holders_poll_s(waiters, lambda: 0.0) == mean / 2 and holders_poll_s(waiters, lambda: 1.0) == mean * 1.5
    assert holders_poll_s(10, lambda: 0.5) < holders_poll_s(1_000, lambda: 0.5) <= HOLDERS_POLL_MAX_S


def test_hundreds_of_refused_shards_read_the_job_row_no_faster_than_a_few_do() -> None:
    """One shard holds the job's last pool while hundreds wait for it: the waiting shards together
    read the job row about HOLDERS_READS_PER_S times a second, not four times a second each."""
    ledger = Ledger()
    request = chat(1, max_tokens=100)
    need = worst_case_nano(request, OPENAI)
    hold_s, waiting = 2.0, 300
    holder = Budget(ledger, "job", need, request_format=OPENAI)
    waiters = [
        Budget(ledger, "job", need, request_format=OPENAI, wait_s=30.0, waiters=waiting + 1) for _ in range(waiting)
    ]
    window: list[float] = []

    async def hold(held: asyncio.Event) -> None:
        assert await holder.reserve(request)
        held.set()
        window.append(time.monotonic())
        await asyncio.sleep(hold_s)
        window.append(time.monotonic())
        # the answer costs all its worst case: nothing comes back that another request could use
        holder.settle(request, Outcome(1, "c1", 200, {"id": "resp_1"}, None))
        await asyncio.to_thread(holder.close)

    async def wait(budget: Budget, index: int, held: asyncio.Event) -> None:
        await held.wait()
        assert not await budget.reserve(chat(index + 2, max_tokens=100))

    async def run() -> None:
        held = asyncio.Event()
        await asyncio.gather(hold(held), *(wait(b, i, held) for i, b in enumerate(waiters)))

    asyncio.run(run())
    assert all(b.exhausted for b in waiters)
    start, end = window
    during = [t for t in ledger.reads if start <= t <= end]
    assert len(during) <= 1.5 * HOLDERS_READS_PER_S * (end - start), len(during)
    # each stopped only once the holder was gone
    assert ledger.holders == 0
    assert ledger.committed == ledger.spent == need


def test_a_shard_with_nothing_held_waits_on_the_table_for_the_pool_another_hands_back() -> None:
    """Against the table itself: the write that hands a refused shard's pool back must tell it
    the job's real figures, or it stops at once with the cap still unspent."""
    request = chat(1, max_tokens=100)
    need = worst_case_nano(request, OPENAI)
    cap = 3 * need
    with mock_aws():
        create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
        store = JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table("jobs"), ttl_days=1)
        store.claim_job("job", execution="e", bucket="b", key="k", etag="t", started_at=0.0)
        store.record_plan("job", plan=plan_figures(1), shards=[(0, 1, 1), (1, 1, 1)], mode="direct", budget_cap=cap)
        holder, waiter = (
            Budget(store, "job", cap, request_format=OPENAI),
            Budget(store, "job", cap, request_format=OPENAI),
        )
        sent = {"holder": 0, "waiter": 0}

        async def shard(budget: Budget, name: str, held: asyncio.Event) -> None:
            if name == "waiter":
                await held.wait()
            for line in range(100):
                req = chat(line, max_tokens=100)
                if not await budget.reserve(req):
                    break
                held.set()
                # the holder's one answer takes a while: the waiter runs dry meanwhile
                await asyncio.sleep(0.5 if name == "holder" else 0)
                budget.settle(req, answer(req, 9, 10))
                sent[name] += 1
                if name == "holder":
                    break
            await asyncio.to_thread(budget.close)

        async def run() -> None:
            held = asyncio.Event()
            await asyncio.gather(shard(holder, "holder", held), shard(waiter, "waiter", held))

        asyncio.run(run())
        job = store.job("job")
    assert job is not None and job.budget_spent is not None and job.budget_committed is not None
    assert sent["holder"] == 1 and sent["waiter"] > 0
    assert cap - need < job.budget_spent == job.budget_committed <= cap
    assert job.budget_holders == 0


def test_a_shard_that_finds_the_cap_spent_writes_the_job_row_once_at_its_end() -> None:
    """A thousand shards reach the cap's end together: each hands its pool back in one write and,
    with no other shard holding one and no room left, stops without another (it once joined a
    count of waiting shards and left it again: two writes more each, 60% of the partition's
    writes at a thousand shards)."""
    ledger = Ledger()
    request = chat(1, max_tokens=100)
    need = worst_case_nano(request, OPENAI)
    budget = Budget(ledger, "job", 3 * need, request_format=OPENAI, chunk_requests=2)

    async def run() -> list[bool]:
        sent = []
        for line in range(4):
            req = chat(line, max_tokens=100)
            sent.append(await budget.reserve(req))
            if sent[-1]:
                budget.settle(req, Outcome(line, f"c{line}", 200, {"id": f"resp_{line}"}, None))
        return sent

    assert asyncio.run(run()) == [True, True, True, False]
    budget.close()
    # the chunk of two; the pool handed back and the last request taken; the pool handed back
    assert budget.exhausted and ledger.holders == 0
    assert ledger.writes == 4
