"""The pure arithmetic that picks, shard by shard, the cheapest way to answer a deadline job by its
deadline (`sluice.plan.deadline` reads the deadline and names the ways), and the plan it makes.

- a shard goes as a **batch** only when, should its batch not have ended by the *cutover*, there
  is still time to cancel it (`cancel_s`: a cancelled batch takes a while to end and hand back what
  it answered) and send every line of every batch shard directly at the key's rate before the
  deadline. The cutover is that latest moment: `deadline - margin - batch lines / key rate`. A
  shard whose batch has not ended by then cancels it, keeps every answer it gave, and sends the
  rest direct (`batch_collect`); nothing is sent twice. The plan assumes the worst: every batch
  late, and its cancel handing back nothing.
- else **flex** where the model has it and the slower sending still ends in time;
- else **direct**.

The key's rate is what its `rpm` (and `tpm`, over the job's tokens a request) allow; where neither is
known, the job's concurrency over `DIRECT_LATENCY_S` a request. The plan runs the shards as the Map
does (`_schedule`): at most `slots` at once, in order, a batch shard holding its slot while it waits,
and each sending at an equal share of the key's rate among the shards `running` (Plan gives each
shard that share). At the cutover the rate is handed over: each batch shard takes its part of the
key's whole rate (`cutover_share`, its lines over all batch lines), so that every late shard, however
few are late, has sent its lines by `cutover + cancel_s + batch lines / key rate`. A job whose lines
cannot all be sent directly by the deadline so is refused (`DeadlineRefused`), with the earliest
finish Sluice could promise.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sluice.core.costs import model_prices
from sluice.plan.deadline import (
    DIRECT_LATENCY_S,
    FLEX_MODELS,
    SEND_SLACK,
    Choice,
    DeadlineRefused,
    flex_key_share,
    has_flex,
    human_duration,
    iso,
)


@dataclass(frozen=True)
class ShardLoad:
    """What one shard asks: its requests, their expected tokens, and the model they go to."""

    shard: int
    requests: int
    tokens_in: int
    tokens_out: int
    model: str | None = None


@dataclass(frozen=True)
class Prices:
    """USD a shard costs each way: direct (list), batch (the Batch API's), flex (its own where the
    price source has one, else the Batch API's; None where the model has no flex). None for a
    model with no known price."""

    direct: float | None
    batch: float | None
    flex: float | None

    @classmethod
    def of(cls, load: ShardLoad, flex_models: Iterable[str] = FLEX_MODELS) -> Prices:
        prices = model_prices(load.model or "")
        if prices is None:
            return cls(None, None, None)
        tokens = [load.tokens_in, load.tokens_out]
        flex = prices.flex.usd(tokens) if has_flex(load.model, flex_models) else None
        return cls(prices.standard.usd(tokens), prices.batch.usd(tokens), flex)


@dataclass(frozen=True)
class KeyLimits:
    """What the job may send at: its key's requests and tokens a minute (0: not known), and its
    concurrency, which with `DIRECT_LATENCY_S` bounds the rate where the key's is not known."""

    rpm: float = 0.0
    tpm: float = 0.0
    concurrency: int = 1000

    def requests_per_s(self, tokens_per_request: float) -> float:
        rates: list[float] = []
        if self.rpm:
            rates.append(self.rpm / 60)
        if self.tpm and tokens_per_request > 0:
            rates.append(self.tpm / 60 / tokens_per_request)
        # no rate known: the job's concurrency at a long round trip each
        return max(min(rates or [self.concurrency / DIRECT_LATENCY_S]), 1e-9)

    def describe(self) -> str:
        parts = [f"{self.rpm:,.0f} requests a minute"] if self.rpm else []
        if self.tpm:
            parts.append(f"{self.tpm:,.0f} tokens a minute")
        if not parts:
            parts.append(f"no rate known: {self.concurrency:,} in flight at {DIRECT_LATENCY_S:g} s a request")
        return ", ".join(parts)


@dataclass(frozen=True)
class DeadlineInputs:
    """Everything the plan is made of but the shards; `now` and `deadline` are epoch seconds."""

    now: float
    deadline: float
    key: KeyLimits
    family: str
    turnaround_s: float
    turnaround_source: str
    # how long a cancelled batch may take to end and hand back its answers (the cutover's margin)
    cancel_s: float = 600.0
    # whether the family has a Batch API Sluice runs, and the fewest rows a batch may hold
    batch: bool = True
    min_batch_requests: int = 1
    # input tokens the model's Batch queue holds at once (0: no limit)
    queue_tokens: int = 0
    # whether direct shards may use the flex tier (OpenAI's family only), and the models that have it
    flex: bool = True
    flex_models: tuple[str, ...] = FLEX_MODELS
    # the Map's slots (its MaxConcurrency; 0: every shard at once) and the shards whose equal shares
    # of the key's rate each shard sends at (0: as many as run at once)
    slots: int = 0
    running: int = 0
    # batch jobs the family runs at once for a model (Bedrock's quota; 0: not counted), and the
    # records one job holds, which is how many jobs a batch shard makes
    max_batch_jobs: int = 0
    batch_records: int = 0


@dataclass(frozen=True)
class ShardChoice:
    """One shard's way, why, what it is expected to cost (next to all direct and all batch) and when
    it is expected to end."""

    shard: int
    requests: int
    choice: str
    why: str
    cost_usd: float | None
    all_direct_usd: float | None
    all_batch_usd: float | None
    finish_at: float
    # a batch shard's part of the key's whole rate once past the cutover (0: not a batch shard)
    cutover_share: float = 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "shard": self.shard,
            "requests": self.requests,
            "choice": self.choice,
            "why": self.why,
            "cost_usd": _round(self.cost_usd),
            "all_direct_usd": _round(self.all_direct_usd),
            "all_batch_usd": _round(self.all_batch_usd),
            "finish_at": iso(self.finish_at),
            "cutover_share": round(self.cutover_share, 6),
        }


@dataclass(frozen=True)
class DeadlinePlan:
    """The job's plan: each shard's choice, the cutover batches are cancelled at, the expected finish."""

    deadline: float
    now: float
    rate_per_s: float
    turnaround_s: float
    turnaround_source: str
    shards: list[ShardChoice] = field(default_factory=list)
    # when a batch shard whose batch has not ended cancels it and sends the rest direct; None: no batch
    cutover_at: float | None = None
    finish_at: float = 0.0
    earliest_direct_finish: float = 0.0
    # the rate each shard sends at before the cutover: the key's over the shards running
    shard_rate_per_s: float = 0.0
    # how long a cancelled batch is given to end and hand back its answers
    cancel_s: float = 0.0

    def total(self, what: str) -> float | None:
        values = [getattr(s, what) for s in self.shards]
        known = [v for v in values if v is not None]
        return round(sum(known), 6) if known else None

    def choices(self) -> dict[int, str]:
        return {s.shard: s.choice for s in self.shards}

    def cutover_shares(self) -> dict[int, float]:
        return {s.shard: s.cutover_share for s in self.shards if s.cutover_share}

    def to_dict(self) -> dict[str, object]:
        return {
            "deadline": iso(self.deadline),
            "planned_at": iso(self.now),
            "key_rate_per_s": round(self.rate_per_s, 3),
            "shard_rate_per_s": round(self.shard_rate_per_s, 3),
            "batch_turnaround_s": round(self.turnaround_s, 1),
            "batch_turnaround_source": self.turnaround_source,
            "batch_cancel_s": round(self.cancel_s, 1),
            "cutover_at": iso(self.cutover_at) if self.cutover_at is not None else None,
            "expected_finish": iso(self.finish_at),
            "earliest_direct_finish": iso(self.earliest_direct_finish),
            "cost_usd": self.total("cost_usd"),
            "all_direct_usd": self.total("all_direct_usd"),
            "all_batch_usd": self.total("all_batch_usd"),
            "shards": [s.to_dict() for s in self.shards],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def running_shards(shards: int, map_concurrency: int) -> int:
    """How many shards run at once, which is how many equal shares of the job's rate Plan cuts."""
    return max(1, min(shards, map_concurrency))


def _schedule(
    loads: Sequence[ShardLoad], kinds: Sequence[str], inputs: DeadlineInputs, rate: float, cutover: float | None
) -> tuple[list[float], list[float]]:
    """Each shard's start and end as the Map runs them: in order, in the first slot free, direct and
    flex at the shard's share of the key's rate; a batch shard late (`cutover` given) holds its slot
    until it has cancelled and sent every line at its part of the whole rate, else it ends at the
    expected turnaround."""
    shard_rate = rate / (inputs.running or running_shards(len(loads), inputs.slots or len(loads)))
    batch_lines = sum(load.requests for load, kind in zip(loads, kinds, strict=True) if kind == Choice.BATCH)
    free = [inputs.now] * max(1, min(inputs.slots or len(loads), len(loads)))
    starts: list[float] = []
    ends: list[float] = []
    for load, kind in zip(loads, kinds, strict=True):
        start = heapq.heappop(free)
        if kind == Choice.BATCH:
            # its part of the whole rate is its lines over all batch lines: every late shard ends together
            late = cutover + inputs.cancel_s + batch_lines / rate * (1 + SEND_SLACK) if cutover is not None else None
            end = late if late is not None else start + inputs.turnaround_s
        else:
            slow = flex_key_share() if kind == Choice.FLEX else 1.0
            end = start + load.requests / shard_rate * slow * (1 + SEND_SLACK)
        heapq.heappush(free, end)
        starts.append(start)
        ends.append(end)
    return starts, ends


def _holds(
    loads: Sequence[ShardLoad], kinds: Sequence[str], inputs: DeadlineInputs, rate: float
) -> tuple[bool, float | None]:
    """Whether an assignment holds the deadline with every batch late and its cancel handing back
    nothing, and its cutover: direct and flex shards end by the cutover (the key is then the late
    shards'), each batch starts early enough to be expected back by then, and the batches' jobs fit
    the family's quota."""
    batch_lines = sum(load.requests for load, kind in zip(loads, kinds, strict=True) if kind == Choice.BATCH)
    cutover = None
    if batch_lines:
        cutover = inputs.deadline - inputs.cancel_s - batch_lines / rate * (1 + SEND_SLACK)
        if inputs.max_batch_jobs and _batch_jobs(loads, kinds, inputs) > inputs.max_batch_jobs:
            return False, cutover
    starts, ends = _schedule(loads, kinds, inputs, rate, cutover)
    until = cutover if cutover is not None else inputs.deadline
    for kind, start, end in zip(kinds, starts, ends, strict=True):
        if kind == Choice.BATCH:
            if start + inputs.turnaround_s > until or end > inputs.deadline:
                return False, cutover
        elif end > until:
            return False, cutover
    return True, cutover


def _batch_jobs(loads: Sequence[ShardLoad], kinds: Sequence[str], inputs: DeadlineInputs) -> int:
    per_job = inputs.batch_records or 0
    return sum(
        math.ceil(load.requests / per_job) if per_job else 1
        for load, kind in zip(loads, kinds, strict=True)
        if kind == Choice.BATCH
    )


def plan_deadline(loads: Iterable[ShardLoad], inputs: DeadlineInputs) -> DeadlinePlan:
    """Each shard's cheapest way that still holds the deadline: batch, else flex, else direct.

    Batch goes to the first shards that may take it, as many as hold (they start first, so their
    batches have the longest to run). Raises `DeadlineRefused` when not even all direct, each shard
    at its share of the key's rate, ends by the deadline."""
    shards = list(loads)
    requests = sum(s.requests for s in shards)
    tokens = sum(s.tokens_in + s.tokens_out for s in shards)
    rate = inputs.key.requests_per_s(tokens / requests if requests else 0.0)
    kinds = [Choice.DIRECT] * len(shards)
    earliest = max(_schedule(shards, kinds, inputs, rate, None)[1], default=inputs.now)
    if earliest > inputs.deadline:
        raise DeadlineRefused(
            f"deadline {iso(inputs.deadline)} cannot be met: {requests:,} requests at the key's rate "
            f"({inputs.key.describe()}: {rate:,.1f} a second, shared by the shards running) take "
            f"{human_duration(earliest - inputs.now)} sent directly; the earliest finish Sluice can promise is "
            f"{iso(earliest)} ({human_duration(earliest - inputs.now)} from now)",
            earliest,
        )
    why: dict[int, str] = {}
    eligible = []
    for at, load in enumerate(shards):
        reason = _why_not_batch(load, inputs)
        if reason is None:
            eligible.append(at)
        else:
            why[at] = reason
    cap, cap_reason = _batch_cap(shards, eligible, inputs)
    taken = _most(shards, kinds, eligible[:cap], Choice.BATCH, inputs, rate)
    for at in eligible[:taken]:
        kinds[at] = Choice.BATCH
    for position in range(taken, len(eligible)):
        why[eligible[position]] = (
            cap_reason
            if position >= cap
            else f"a batch expected in {human_duration(inputs.turnaround_s)} would leave too little time to "
            "send its lines directly should it not end"
        )
    flexible = [
        at
        for at, load in enumerate(shards)
        if kinds[at] != Choice.BATCH and inputs.flex and has_flex(load.model, inputs.flex_models)
    ]
    for at in flexible[: _most(shards, kinds, flexible, Choice.FLEX, inputs, rate)]:
        kinds[at] = Choice.FLEX
    ok, cutover = _holds(shards, kinds, inputs, rate)
    assert ok, "every step kept the deadline"
    batch_why = (
        f"a batch is expected in {human_duration(inputs.turnaround_s)}, and should it not have ended "
        "by the cutover there is time to cancel it and send what it left directly"
    )
    chosen = {
        load.shard: (
            kind,
            batch_why
            if kind == Choice.BATCH
            else f"flex at batch prices ends in time ({why[at]})"
            if kind == Choice.FLEX
            else why[at],
        )
        for at, (load, kind) in enumerate(zip(shards, kinds, strict=True))
    }
    return _finish(shards, chosen, inputs, rate, cutover, earliest)


def _batch_cap(shards: Sequence[ShardLoad], eligible: Sequence[int], inputs: DeadlineInputs) -> tuple[int, str]:
    """How many of the eligible shards the provider's queue and job quota let batch at once, and why
    not more."""
    tokens = jobs = 0
    for count, at in enumerate(eligible):
        load = shards[at]
        tokens += load.tokens_in
        jobs += math.ceil(load.requests / inputs.batch_records) if inputs.batch_records else 1
        if inputs.queue_tokens and tokens > inputs.queue_tokens:
            return count, f"the Batch queue holds {inputs.queue_tokens:,} tokens, and the batches before it fill it"
        if inputs.max_batch_jobs and jobs > inputs.max_batch_jobs:
            return count, (
                f"the {inputs.family} provider runs {inputs.max_batch_jobs:,} batch jobs of a model at once, "
                "and the batches before it take them"
            )
    return len(eligible), ""


def _most(
    shards: Sequence[ShardLoad],
    kinds: Sequence[str],
    candidates: Sequence[int],
    choice: str,
    inputs: DeadlineInputs,
    rate: float,
) -> int:
    """The most of `candidates` (first ones first) that may go as `choice` beside `kinds` and hold
    the deadline: a search by halves, each step one schedule, so that Plan stays quick at thousands
    of shards."""

    def holds(count: int) -> bool:
        chosen = set(candidates[:count])
        trial = [choice if at in chosen else kind for at, kind in enumerate(kinds)]
        return _holds(shards, trial, inputs, rate)[0]

    low, high = 0, len(candidates)
    while low < high:
        middle = (low + high + 1) // 2
        if holds(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _why_not_batch(load: ShardLoad, inputs: DeadlineInputs) -> str | None:
    if not inputs.batch:
        return f"the {inputs.family} provider has no Batch API Sluice runs"
    if load.requests < inputs.min_batch_requests:
        return f"{load.requests:,} requests are fewer than a batch takes ({inputs.min_batch_requests:,})"
    return None


def _finish(
    shards: list[ShardLoad],
    chosen: dict[int, tuple[str, str]],
    inputs: DeadlineInputs,
    rate: float,
    cutover: float | None,
    earliest: float,
) -> DeadlinePlan:
    """Expected finishes as the Map runs the shards, batches ending at the expected turnaround."""
    kinds = [chosen[load.shard][0] for load in shards]
    ends = _schedule(shards, kinds, inputs, rate, None)[1]
    batch_lines = sum(load.requests for load, kind in zip(shards, kinds, strict=True) if kind == Choice.BATCH)
    plan: list[ShardChoice] = []
    for load, finish in zip(shards, ends, strict=True):
        choice, why = chosen[load.shard]
        prices = Prices.of(load, inputs.flex_models)
        cost = {Choice.BATCH: prices.batch, Choice.FLEX: prices.flex}.get(choice, prices.direct)
        share = load.requests / batch_lines if choice == Choice.BATCH else 0.0
        plan.append(
            ShardChoice(load.shard, load.requests, choice, why, cost, prices.direct, prices.batch, finish, share)
        )
    return DeadlinePlan(
        deadline=inputs.deadline,
        now=inputs.now,
        rate_per_s=rate,
        turnaround_s=inputs.turnaround_s,
        turnaround_source=inputs.turnaround_source,
        shards=plan,
        cutover_at=cutover,
        finish_at=max([s.finish_at for s in plan] or [inputs.now]),
        earliest_direct_finish=earliest,
        shard_rate_per_s=rate / (inputs.running or running_shards(len(shards), inputs.slots or len(shards))),
        cancel_s=inputs.cancel_s,
    )


def plan_lines(plan: DeadlinePlan) -> list[str]:
    """The plan as `sluice estimate --deadline` prints it."""
    lines = [
        f"  deadline {iso(plan.deadline)} ({human_duration(plan.deadline - plan.now)} from now); key rate "
        f"{plan.rate_per_s:,.1f} requests a second ({plan.shard_rate_per_s:,.1f} a shard until the cutover); "
        f"batch turnaround {human_duration(plan.turnaround_s)} ({plan.turnaround_source}); "
        f"{human_duration(plan.cancel_s)} for a cancel",
    ]
    width = max(len(str(s.shard)) for s in plan.shards) if plan.shards else 1
    for s in plan.shards:
        lines.append(
            f"  shard {s.shard:>{width}}: {s.choice:<6} {s.requests:>9,} requests  {_usd(s.cost_usd):>10} "
            f"(direct {_usd(s.all_direct_usd)}, batch {_usd(s.all_batch_usd)})  ends ~{iso(s.finish_at)}: {s.why}"
        )
    lines.append(
        f"  plan: {_usd(plan.total('cost_usd'))} against {_usd(plan.total('all_direct_usd'))} all direct and "
        f"{_usd(plan.total('all_batch_usd'))} all batch; expected finish {iso(plan.finish_at)}"
        + (f"; batches not ended by {iso(plan.cutover_at)} are cancelled and sent direct" if plan.cutover_at else "")
    )
    return lines


def _usd(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.4f}"
