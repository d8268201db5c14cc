"""The job's spending cap (`sluice-budget-usd`), held across every shard that runs at once.

The job row keeps two figures in nano-USD (integers, so no float drifts in DynamoDB):
`budget_cap` and `budget_committed`, what the job's shards have spent plus what they hold
reserved. A shard reserves a chunk with one conditional `ADD` (`committed <= cap - chunk`),
spends it locally on the worst-case cost of each request it sends, and on each answer gives
the difference between that worst case and the answer's real usage back to its own pool. Once
the table refuses a chunk, the shard lives on its refunds: it waits for its own requests in
flight rather than write again, and with none left hands its pool back and takes what the table
still has, once that covers the next request. It stops sending only when the table cannot and no
other shard holds a pool (`budget_holders`), so the last shard to stop has seen every refund:
the job ends with less than one request's worst case unspent, and never spends more than the cap
as long as the worst-case estimates hold. A waiting shard reads the row again only after a
jittered wait that grows with the job's shards in flight (all of them may wait at once when the cap
runs out): together they read it about HOLDERS_READS_PER_S times a second, however many wait. The
row does not count the waiting shards: at the cap's end every shard would write it twice more, to
join the count and to leave it, and a thousand shards ending at once would take most of the
partition's writes for it.

A request's worst case: the prompt at one token per 4 bytes of its body (JSON keys included,
which more than covers English text) plus its output cap (the request format's `output_cap`: the
most output its body allows, times the answers it asks for), or DEFAULT_OUTPUT_TOKENS when the
body sets none; at the model's Batch API price in batch mode, and at the long-context tier's
where that prompt passes it. An answer is charged its usage at its price, cached input tokens at
the cached rate. An answer without usage (a background response still running) keeps its worst
case as spent.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from sluice.contract import causes
from sluice.contract.model import Outcome, Request
from sluice.core.costs import price_per_million
from sluice.providers import RequestFormat
from sluice.store.rows import BudgetState

NANO = 1_000_000_000
# the output a request may produce when its body sets no cap; set one for a hard bound.
# Larger than the shared limiter's guess on purpose: this one is held against a cap that must
# not be passed, and a direct answer's real usage gives the difference back
DEFAULT_OUTPUT_TOKENS = 1024
# a chunk covers this many requests of the last size seen, so a shard writes the job row about
# once per CHUNK_REQUESTS lines, plus once at the end of each run; a shard whose pool ran out in
# less than CHUNK_MIN_PERIOD_S asks for twice as many the next time (up to CHUNK_MAX_REQUESTS), so
# a fast shard writes the one job row at most about every CHUNK_MIN_PERIOD_S: 1,000 shards at 32
# requests a second each write it 200 times a second, not 633 (the item takes 1,000)
CHUNK_REQUESTS = 50
CHUNK_MIN_PERIOD_S = 5.0
CHUNK_MAX_REQUESTS = 1_600
# a shard the table refuses waits for the shards that still hold a pool to hand it back, for at
# most HOLDERS_WAIT_S (a shard that died holding a pool never hands it back; a shard's run keeps
# it within its safety margin, so a request still has its timeout to run). It reads the job row
# every HOLDERS_POLL_S, or, when many may wait, about every shards / HOLDERS_READS_PER_S seconds (at
# most HOLDERS_POLL_MAX_S): all of them together then read the one item about HOLDERS_READS_PER_S
# times a second (a strongly consistent read of a small item is 1 RCU; the partition serves 3,000)
HOLDERS_POLL_S = 0.25
HOLDERS_POLL_MAX_S = 5.0
HOLDERS_READS_PER_S = 200.0
HOLDERS_WAIT_S = 20.0


def usd_to_nano(usd: float) -> int:
    return round(usd * NANO)


def nano_to_usd(nano: int) -> float:
    return round(nano / NANO, 9)


def unpriced_model(model: str | None) -> bool:
    return price_per_million(model or "") is None


def worst_case_nano(request: Request, request_format: RequestFormat, *, batch: bool = False) -> int:
    """The most this request may cost, in nano-USD; raises KeyError for a model with no price."""
    raw = request.body or b"{}"
    body = orjson.loads(raw)
    model = request_format.model(body)
    price = price_per_million(model, "batch" if batch else "standard")
    if price is None:
        raise KeyError(model)
    tokens_in = math.ceil(len(raw) / 4)
    tokens_out = request_format.output_cap(body, request.path, default=DEFAULT_OUTPUT_TOKENS)
    # a request that asks to write the prompt cache (Anthropic's `cache_control`) may write all
    # its input at the cache-write price, above the input's; any other pays at most the input's
    written = tokens_in if b'"cache_control"' in raw else 0
    worst = price.for_request(tokens_in)
    return math.ceil(worst.usd([tokens_in, tokens_out, 0, written]) * NANO)


def actual_nano(
    outcome: Outcome, request_model: str, reserved: int, request_format: RequestFormat, *, batch: bool = False
) -> int:
    """What an answer cost: its usage at its model's price; a failed request costs nothing, an
    answer without usage (a background response still running) its reservation."""
    if not outcome.ok:
        return 0
    usage = request_format.usage(outcome.body)
    if usage is None:
        return reserved
    tier = "batch" if batch else "standard"
    answered = request_format.answered_model(outcome.body)
    price = price_per_million(answered, tier) if answered is not None else None
    price = price or price_per_million(request_model, tier)
    if price is None:
        return reserved
    tokens = [usage.tokens_in, usage.tokens_out, usage.cached_in, usage.cache_write]
    return math.ceil(price.for_request(usage.tokens_in).usd(tokens) * NANO)


def holders_poll_s(waiters: int, rand: Callable[[], float]) -> float:
    """How long a shard waiting for the others' pools sleeps before it reads the job row again,
    when `waiters` shards may wait (the job's shards in flight): uniform in [0.5, 1.5] times a
    spread that keeps their reads together near HOLDERS_READS_PER_S a second, so shards that began
    waiting at once do not read in step."""
    spread = min(HOLDERS_POLL_MAX_S, max(HOLDERS_POLL_S, waiters / HOLDERS_READS_PER_S))
    return spread * (0.5 + rand())


class BudgetTable(Protocol):
    """The job row's figures (`JobStore` implements it): committed, spent, and how many shards
    hold a pool."""

    def reserve_budget(self, job_id: str, amount: int, cap: int, spent: int, *, join: bool) -> BudgetState | None: ...

    def budget_state(self, job_id: str) -> BudgetState: ...

    def release_budget(self, job_id: str, amount: int, spent: int, *, leave: bool) -> BudgetState: ...


@dataclass
class BudgetFigures:
    reserved_writes: int = 0
    refused: int = 0
    releases: int = 0


@dataclass
class Budget:
    """One shard run's share of the job's cap: a local pool refilled from the job row in chunks.

    `reserve` before a request is sent (False: the job's budget is spent, stop sending) and
    `settle` with its outcome; `close` hands what is left back to the job row. `spent` is what
    this run's answers cost, in nano-USD.
    """

    table: BudgetTable
    job_id: str
    cap: int
    # how its requests and answers read (`sluice.providers`)
    request_format: RequestFormat = field(kw_only=True)
    batch: bool = False
    chunk_requests: int = CHUNK_REQUESTS
    held: int = 0
    spent: int = 0
    exhausted: bool = False
    figures: BudgetFigures = field(default_factory=BudgetFigures)
    # counted among the job row's `budget_holders` (from the first reservation to the release)
    holding: bool = False
    # how long a refused shard waits for the others' pools (see HOLDERS_WAIT_S)
    wait_s: float = HOLDERS_WAIT_S
    # the job's shards that may wait for the others' pools at once: its shards in flight
    waiters: int = 1
    # the jitter of that wait's reads (`holders_poll_s`)
    rand: Callable[[], float] = random.random
    # the table refused a chunk: from now on the shard lives on its refunds, asking only when empty
    scarce: bool = False
    # the figures as this shard's last write left them: a chunk they leave no room for is not asked
    known: BudgetState | None = None
    # spent since the last write: each write to the job row carries it
    _unrecorded: int = 0
    _reserved: dict[int, tuple[int, str]] = field(default_factory=dict)
    # the chunk's size now, and when the last one was written (event loop time)
    _chunk: int = 0
    _chunk_at: float | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _settled: asyncio.Event = field(default_factory=asyncio.Event)

    def cost(self, request: Request) -> tuple[int, str]:
        body = orjson.loads(request.body or b"{}")
        return worst_case_nano(request, self.request_format, batch=self.batch), self.request_format.model(body)

    async def reserve(self, request: Request) -> bool:
        need, model = self.cost(request)
        async with self._lock:
            if not await self._cover(need):
                return False
            self.held -= need
            self._reserved[request.line] = (need, model)
            return True

    async def take(self, need: int) -> bool:
        """Reserve exactly `need` (a batch part's worst case), counted as spent; False if the cap refuses."""
        async with self._lock:
            if self.exhausted:
                return False
            if self.held < need and not await self._write_reserve(need - self.held, cause=causes.BUDGET_PART):
                self.exhausted = True
                return False
            self.held -= need
            self.spend(need)
            return True

    async def _cover(self, need: int) -> bool:
        while not self.exhausted:
            if self.held >= need:
                return True
            if not self.scarce:
                amount = max(need - self.held, need * self._next_chunk())
                # near the cap a refused conditional write costs as much as a granted one: once the
                # table refuses a chunk, or the figures say it would, stop asking for chunks
                if not self._left_no_room(amount) and await self._write_reserve(amount):
                    self._chunk_at = asyncio.get_running_loop().time()
                    continue
                self.scarce = True
            if self._reserved:
                # requests of ours are in flight: what they do not use comes back to the pool
                self._settled.clear()
                await self._settled.wait()
                continue
            # give the pool back, then ask for exactly this request until no other shard holds a
            # pool: only then has every refund reached the table, and a refusal is final
            state = await self._hand_back()
            if not await self._last_ask(need, state):
                self.exhausted = True
        return False

    async def _last_ask(self, need: int, state: BudgetState) -> bool:
        """With an empty pool and the figures as `state`: take what is left (up to a chunk) once it
        covers `need`; False once it does not and no other shard holds a pool, or after `wait_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while True:
            left = self.cap - state.committed
            if left >= need and await self._write_reserve(min(left, need * self.chunk_requests)):
                return True
            if state.holders <= 0 or loop.time() >= deadline:
                return False
            wait_s = holders_poll_s(self.waiters, self.rand)
            await asyncio.sleep(wait_s)
            with causes.because(causes.BUDGET_WAIT, period_s=wait_s):
                state = await asyncio.to_thread(self.table.budget_state, self.job_id)

    def _next_chunk(self) -> int:
        """Requests the next chunk covers: twice the last when the last lasted less than
        CHUNK_MIN_PERIOD_S."""
        if not self._chunk:
            self._chunk = self.chunk_requests
        elif self._chunk_at is not None and asyncio.get_running_loop().time() - self._chunk_at < CHUNK_MIN_PERIOD_S:
            self._chunk = min(2 * self._chunk, max(self.chunk_requests, CHUNK_MAX_REQUESTS))
        return self._chunk

    def _left_no_room(self, amount: int) -> bool:
        """The job row's figures, as this shard last wrote them, leave less than `amount` under the
        cap (refunds since may have made room: the wait for the others' pools finds them)."""
        return self.known is not None and self.cap - self.known.committed < amount

    async def _write_reserve(self, amount: int, *, cause: causes.Cause = causes.BUDGET_CHUNK) -> bool:
        # the write runs on a thread while answers settle on the loop: the figures it carries
        # are taken before it and changed only here, on the loop, after it
        self.figures.reserved_writes += 1
        join, recorded = not self.holding, self._unrecorded
        chunk = cause is causes.BUDGET_CHUNK
        with causes.because(
            cause, period_s=CHUNK_MIN_PERIOD_S if chunk else None, every=self.chunk_requests if chunk else None
        ):
            granted = await asyncio.to_thread(
                self.table.reserve_budget, self.job_id, amount, self.cap, recorded, join=join
            )
        if granted is None:
            self.figures.refused += 1
            return False
        self.known = granted
        self.held += amount
        self._unrecorded -= recorded
        self.holding = True
        return True

    def settle(self, request: Request, outcome: Outcome) -> None:
        reserved, model = self._reserved.pop(request.line, (0, ""))
        cost = actual_nano(outcome, model, reserved, self.request_format, batch=self.batch)
        self.held += reserved - cost
        self.spend(cost)
        self._settled.set()

    def spend(self, nano: int) -> None:
        self.spent += nano
        self._unrecorded += nano

    async def _hand_back(self) -> BudgetState:
        """Hand the pool back and stop holding one, in one write; the figures as it left them."""
        held, recorded, holding = self.held, self._unrecorded, self.holding
        self.figures.releases += 1
        with causes.because(causes.BUDGET_WAIT):
            state = await asyncio.to_thread(self.table.release_budget, self.job_id, -held, recorded, leave=holding)
        self.held -= held
        self._unrecorded -= recorded
        self.holding = False
        self.known = state
        return state

    def close(self) -> None:
        """Hand the pool back to the job row, with the spend not yet written, once nothing is in
        flight. Requests still reserved (none, once the engine has drained) count at their worst case."""
        for reserved, _ in self._reserved.values():
            self.spend(reserved)
        self._reserved.clear()
        if self.held or self._unrecorded or self.holding:
            self.figures.releases += 1
            self.table.release_budget(self.job_id, -self.held, self._unrecorded, leave=self.holding)
        self.held = 0
        self._unrecorded = 0
        self.holding = False


def budget_models(models: Iterable[str | None]) -> list[str]:
    """The models among `models` that have no known price (a budget cannot be held for them)."""
    return sorted({m or "" for m in models if unpriced_model(m)})
