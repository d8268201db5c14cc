"""A deadline job's flex shard (issue 44) on the wire: each OpenAI request of a spec at the flex tier
asks for `service_tier: flex`, a line's own tier is kept, and any other spec's requests go as written;
and an answer served at flex is priced at batch prices."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from sluice.contract import ShardSpec
from sluice.contract.model import FLEX, Outcome, Request, ServiceTier
from sluice.core.costs import provider_costs
from sluice.formats.lines import parse_line
from sluice.merge.summary import batch_priced
from sluice.providers import ANTHROPIC, OPENAI
from sluice.shard.frame import read_shard_lines
from sluice.shard.stats import Stats

from tests.unit.test_engine import Scripted, run, serve


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
