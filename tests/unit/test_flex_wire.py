"""A deadline job's flex shard (issue 44) on the wire: each OpenAI request of a spec at the flex tier
asks for `service_tier: flex`, a line's own tier is kept, and any other spec's requests go as written;
and an answer served at flex is priced at batch prices."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from sluice.contract import ShardSpec
from sluice.contract.model import FLEX, Outcome, Request, ServiceTier
from sluice.core.costs import provider_costs
from sluice.core.retry import RetryPolicy, tier_timeout_s
from sluice.formats.lines import parse_line
from sluice.merge.summary import batch_priced
from sluice.providers import ANTHROPIC, OPENAI
from sluice.shard.frame import read_shard_lines
from sluice.shard.stats import Stats

from tests.unit.helpers.engine import Scripted, run, serve


def line(custom_id: str, url: str = "/v1/chat/completions", **extra: Any) -> bytes:
    if url == "/v1/responses":
        body: dict[str, Any] = {"model": "gpt-5-mini", "input": "hi", **extra}
    elif url == "/v1/embeddings":
        body = {"model": "text-embedding-3-small", "input": "hi", **extra}
    else:
        body = {"model": "gpt-5-mini", "messages": [{"role": "user", "content": "hi"}], **extra}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


LINES = [
    line("chat"),
    line("responses", "/v1/responses"),
    line("own", service_tier="priority"),
    line("embeddings", "/v1/embeddings"),
]


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def iter_chunks(self, size: int) -> Iterator[bytes]:
        yield self._data


class _S3:
    """The one call `read_shard_lines` makes of S3: the shard's byte range of the input."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def get_object(self, **kw: Any) -> dict[str, Any]:
        start, end = (int(n) for n in kw["Range"].removeprefix("bytes=").split("-"))
        return {"Body": _Body(self.data[start : end + 1])}


def spec(data: bytes, tier: ServiceTier) -> ShardSpec:
    return ShardSpec(
        job_id="j",
        shard=0,
        bucket="b",
        key="in.jsonl",
        etag="e",
        start=0,
        end=len(data),
        first_line=1,
        lines=len(LINES),
        mode="direct",
        concurrency=4,
        max_attempts=1,
        service_tier=tier,
    )


def sent(tier: ServiceTier) -> dict[str, dict[str, Any]]:
    """Each line's body as the provider received it, by custom_id, from a shard at `tier`."""
    data = b"\n".join(LINES) + b"\n"
    requests = [r for r in read_shard_lines(_S3(data), spec(data, tier)) if isinstance(r, Request)]

    async def go() -> list[dict[str, Any]]:
        async with serve(Scripted()) as provider:
            await run(provider, requests)
            return provider.log

    return {entry["cid"]: orjson.loads(entry["body"]) for entry in asyncio.run(go())}


def test_a_flex_spec_asks_each_chat_and_responses_request_for_flex() -> None:
    bodies = sent(FLEX)
    assert bodies["chat"]["service_tier"] == "flex" and bodies["responses"]["service_tier"] == "flex"
    # the rest of the body is the line's, untouched
    assert bodies["chat"]["messages"] == [{"role": "user", "content": "hi"}] and bodies["responses"]["input"] == "hi"
    # a line that names its own tier keeps it; an endpoint that takes none is sent as written
    assert bodies["own"]["service_tier"] == "priority"
    assert "service_tier" not in bodies["embeddings"]


def test_a_spec_at_the_default_tier_adds_nothing() -> None:
    bodies = sent("")
    assert "service_tier" not in bodies["chat"] and "service_tier" not in bodies["responses"]
    assert bodies["own"]["service_tier"] == "priority"


def test_the_request_body_stays_the_line_as_asked() -> None:
    # what the response cache keys by: a flex answer is the same answer as a default one
    flex = parse_line(LINES[0], 1, service_tier=FLEX)
    default = parse_line(LINES[0], 1)
    assert isinstance(flex, Request) and isinstance(default, Request)
    assert flex.body == default.body and flex.tier == FLEX and default.tier == ""


def test_only_openai_splices_a_tier() -> None:
    assert OPENAI.tiered(b"{}", FLEX) == b'{"service_tier":"flex"}'
    assert orjson.loads(OPENAI.tiered(b'{"model":"m"}', FLEX)) == {"service_tier": "flex", "model": "m"}
    assert ANTHROPIC.added_tier("/v1/chat/completions", {"model": "claude-sonnet-4"}, FLEX) == ""
    assert OPENAI.batch_priced({"service_tier": "flex"}) and not OPENAI.batch_priced({"service_tier": "default"})


def answer(tier: str) -> Outcome:
    body = {"model": "gpt-5-mini", "service_tier": tier, "usage": {"prompt_tokens": 1000, "completion_tokens": 500}}
    return Outcome(1, "a", 200, body, "req")


def test_an_answer_served_at_flex_is_priced_at_batch_prices() -> None:
    stats = Stats()
    stats.add_outcome(answer("flex"), request_format=OPENAI)
    stats.add_outcome(answer("default"), request_format=OPENAI)
    again = Stats.from_dict(orjson.loads(orjson.dumps(stats.to_dict())))
    merged = Stats()
    merged.merge(again)
    assert merged.models == {"gpt-5-mini": [2000, 1000]}
    assert merged.batch_priced_models == {"gpt-5-mini": [1000, 500]}
    costs = provider_costs(merged.models, batch_priced(merged, {}))
    assert costs.all_direct is not None and costs.all_batch is not None and costs.as_run is not None
    # one answer at list price, one at half
    assert costs.as_run == pytest.approx(costs.all_direct * 0.75)
    assert costs.all_batch == pytest.approx(costs.all_direct / 2)


def test_a_batch_row_served_at_flex_is_not_discounted_twice() -> None:
    stats = Stats()
    stats.add_outcome(answer("flex"), request_format=OPENAI)
    assert batch_priced(stats, {"gpt-5-mini": [1000, 500]}) == {"gpt-5-mini": [1000, 500]}
    assert batch_priced(Stats(), {"gpt-4o-mini": [10, 5]}) == {"gpt-4o-mini": [10, 5]}


UNAVAILABLE: Any = (
    "status",
    429,
    {},
    {
        "error": {
            "message": "Resource unavailable",
            "type": "rate_limit_error",
            "param": None,
            "code": "resource_unavailable",
        }
    },
)
REFUSED: Any = (
    "status",
    400,
    {},
    {
        "error": {
            "message": "Unsupported service_tier: flex",
            "type": "invalid_request_error",
            "param": "service_tier",
            "code": "invalid_value",
        }
    },
)


def flex_request(n: int) -> Request:
    body = orjson.dumps({"model": "gpt-5-mini", "messages": [{"role": "user", "content": f"hi {n}"}]})
    return Request(n + 1, f"r{n}", "POST", "/v1/chat/completions", body, tier=FLEX)


def tiers_sent(provider: Scripted, custom_id: str) -> list[str | None]:
    return [orjson.loads(e["body"]).get("service_tier") for e in provider.log if e["cid"] == custom_id]


def flex_run(provider: Scripted, requests: list[Request], concurrency: int = 4) -> tuple[Scripted, Any]:
    async def go() -> Any:
        async with serve(provider):
            return await run(provider, requests, concurrency=concurrency)

    return provider, asyncio.run(go())


def test_after_two_resource_unavailable_answers_a_flex_line_goes_on_at_the_standard_tier() -> None:
    provider, ran = flex_run(
        Scripted(script={"r0": [UNAVAILABLE, UNAVAILABLE], "r1": [UNAVAILABLE]}), [flex_request(0), flex_request(1)]
    )
    by_id = {o.custom_id: o for o in ran.outcomes}
    assert all(o.ok for o in ran.outcomes)
    assert tiers_sent(provider, "r0") == ["flex", "flex", None] and by_id["r0"].tier_fallback
    # one answer without capacity is retried at flex, after the usual wait
    assert tiers_sent(provider, "r1") == ["flex", "flex"] and not by_id["r1"].tier_fallback
    assert ran.stats.tier_fallbacks == 1 and ran.stats.tier_refused is None
    # flex's capacity is not the key's rate: no throttle counted, so the shard's pace holds
    assert ran.stats.throttled_429 == 0 and by_id["r0"].throttled == 0
    stats = Stats()
    for outcome in ran.outcomes:
        stats.add_outcome(outcome, request_format=OPENAI)
    assert stats.tier_fallback == 1 and Stats.from_dict(stats.to_dict()).tier_fallback == 1


def test_a_model_that_refuses_flex_sends_the_rest_of_the_run_at_the_standard_tier() -> None:
    provider, ran = flex_run(Scripted(script={"r0": [REFUSED]}), [flex_request(n) for n in range(5)], concurrency=1)
    assert all(o.ok for o in ran.outcomes) and ran.stats.failed == 0
    assert tiers_sent(provider, "r0") == ["flex", None]
    # learnt once: the later requests are not asked at flex at all
    assert [tiers_sent(provider, f"r{n}") for n in range(1, 5)] == [[None]] * 4
    assert ran.stats.tier_fallbacks == 5 and "service_tier" in (ran.stats.tier_refused or "")
    assert all(o.tier_fallback for o in ran.outcomes)


def test_what_openai_says_of_a_tier() -> None:
    assert OPENAI.tier_unavailable(429, UNAVAILABLE[3])
    assert not OPENAI.tier_unavailable(429, {"error": {"code": "rate_limit_exceeded", "message": "slow down"}})
    assert OPENAI.tier_refused(400, REFUSED[3])
    assert OPENAI.tier_refused(400, {"error": {"message": "Flex is not available for this model.", "param": None}})
    assert not OPENAI.tier_refused(400, {"error": {"message": "'messages' must be a non-empty array."}})
    assert not OPENAI.tier_refused(500, REFUSED[3])
    assert not ANTHROPIC.tier_unavailable(429, UNAVAILABLE[3]) and not ANTHROPIC.tier_refused(400, REFUSED[3])


def test_a_flex_attempt_waits_up_to_fifteen_minutes_within_what_the_lambda_has_left() -> None:
    policy = RetryPolicy(request_timeout_s=120.0)
    assert tier_timeout_s(policy, math.inf) == 900.0 == 15 * 60
    # an answer after the Lambda's end is lost with it
    assert tier_timeout_s(policy, 600.0) == 600.0
    # never under the standard timeout, which the run keeps in hand when it stops taking requests
    assert tier_timeout_s(policy, 30.0) == 120.0


def test_a_flex_request_waits_for_its_slow_answer_where_a_standard_one_times_out() -> None:
    slow = ("hang", 0.5)
    provider = Scripted(script={"r0": [slow], "plain": [slow]})
    plain = Request(9, "plain", "POST", "/v1/chat/completions", flex_request(9).body)
    policy = RetryPolicy(max_attempts=1, request_timeout_s=0.1, tier_timeout_s=5.0)

    async def go() -> Any:
        async with serve(provider):
            return await run(provider, [flex_request(0), plain], policy=policy)

    by_id = {o.custom_id: o for o in asyncio.run(go()).outcomes}
    assert by_id["r0"].ok and not by_id["plain"].ok


def test_a_line_that_fails_at_the_standard_tier_still_counts_as_fallen_back() -> None:
    server_error: Any = ("status", 500, {}, {"error": {"message": "boom", "code": "server_error"}})
    script = {"r0": [UNAVAILABLE, UNAVAILABLE, server_error, server_error, server_error, server_error]}
    _, ran = flex_run(Scripted(script=script), [flex_request(0)])
    [outcome] = ran.outcomes
    assert not outcome.ok and outcome.tier_fallback and ran.stats.tier_fallbacks == 1
