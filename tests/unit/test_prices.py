"""Prices from genai-prices' bundled snapshot: each family's batch and flex rules, cached input
and cache writes, long-context tiers, overrides before the source, and no network ever."""

from __future__ import annotations

import math
from typing import Any

import genai_prices.update_prices
import orjson
import pytest
from genai_prices import data_snapshot
from sluice.contract.model import Outcome, Request
from sluice.core import costs
from sluice.core.costs import model_prices, price_per_million, provider_cost_usd, provider_costs
from sluice.core.prices import PRICES_ENV, env_overrides
from sluice.limits.budget import NANO, actual_nano, worst_case_nano
from sluice.providers import ANTHROPIC, BEDROCK, OPENAI, Usage


@pytest.fixture(autouse=True)
def no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRICES_ENV, raising=False)


def test_gpt_5_5_has_the_sources_list_batch_flex_and_cached_prices() -> None:
    prices = model_prices("gpt-5.5")
    assert prices is not None and prices.source == "genai-prices openai/gpt-5.5"
    assert (prices.standard.input, prices.standard.cached_input, prices.standard.output) == (5.0, 0.5, 30.0)
    assert (prices.batch.input, prices.batch.output) == (2.5, 15.0)
    assert (prices.flex.input, prices.flex.output) == (2.5, 15.0)
    # a dated snapshot takes its model's price
    assert model_prices("gpt-4o-mini-2024-07-18") == model_prices("gpt-4o-mini")


def test_a_long_prompt_takes_the_long_context_tier_for_all_its_tokens() -> None:
    price = price_per_million("gpt-5.5")
    assert price is not None
    assert price.for_request(272_000).input == 5.0
    long = price.for_request(272_001)
    assert (long.input, long.output) == (10.0, 45.0)


def test_anthropic_prices_cache_reads_and_writes_and_bedrock_halves_for_batch() -> None:
    sonnet = model_prices("claude-sonnet-4-5-20250929")
    assert sonnet is not None and sonnet.source == "genai-prices anthropic/claude-sonnet-4-5"
    assert (sonnet.standard.cached_input, sonnet.standard.cache_write) == (0.3, 3.75)
    assert (sonnet.batch.input, sonnet.batch.cache_write) == (1.5, 1.875)
    # 1,000 fresh input tokens, 10,000 read from the cache, 2,000 written to it, 500 out
    assert sonnet.standard.usd([13_000, 500, 10_000, 2_000]) == pytest.approx(
        (1_000 * 3.0 + 10_000 * 0.3 + 2_000 * 3.75 + 500 * 15.0) / 1e6
    )
    # Bedrock's own prices (a cross-region profile's), its batch inference at half: the source has none
    bedrock = model_prices("us.anthropic.claude-sonnet-4-5-20250929-v1:0")
    assert bedrock is not None and bedrock.source.startswith("genai-prices aws/")
    assert bedrock.batch.input == pytest.approx(bedrock.standard.input / 2)
    assert model_prices("my-finetune") is None


def test_the_environment_and_the_table_override_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PRICES_ENV, orjson.dumps({"gpt-5.5": [1, 2, 0.1], "my-finetune": [3, 4]}).decode())
    ours = model_prices("gpt-5.5")
    assert ours is not None and ours.source == "override"
    assert (ours.standard.input, ours.standard.output, ours.standard.cached_input) == (1.0, 2.0, 0.1)
    assert ours.batch.input == 0.5
    assert provider_cost_usd({"my-finetune-v2": [1_000_000, 1_000_000]}) == 7.0
    monkeypatch.delenv(PRICES_ENV)
    monkeypatch.setitem(costs.PROVIDER_PRICES, "claude-haiku-4-5", (0.5, 2.5))
    haiku = price_per_million("claude-haiku-4-5-20251001")
    assert haiku is not None and (haiku.input, haiku.output, haiku.cached_input) == (0.5, 2.5, None)
    with pytest.raises(ValueError, match=PRICES_ENV):
        env_overrides("{not json")
    with pytest.raises(ValueError, match="input, output"):
        env_overrides('{"m": [1]}')


def test_only_the_bundled_snapshot_is_read_and_nothing_is_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fetch(*args: object, **kwargs: object) -> None:
        raise AssertionError("prices must not be fetched")

    monkeypatch.setattr(genai_prices.update_prices.UpdatePrices, "__init__", no_fetch)
    monkeypatch.setattr(genai_prices.update_prices.UpdatePrices, "fetch", no_fetch)
    # a snapshot another library set (UpdatePrices sets one) is not what Sluice prices by
    monkeypatch.setattr(
        data_snapshot, "_custom_snapshot", data_snapshot.DataSnapshot(providers=[], from_auto_update=True)
    )
    prices = model_prices("o4-mini")
    assert prices is not None and prices.standard.input == 1.1


def _request(body: Any, path: str = "/v1/chat/completions") -> Request:
    return Request(1, "a", "POST", path, orjson.dumps(body))


def _answer(body: Any) -> Outcome:
    return Outcome(1, "a", 200, body, "req")


def test_an_answer_costs_its_cached_input_at_the_cached_price() -> None:
    usage: dict[str, Any] = {"prompt_tokens": 10_000, "completion_tokens": 100}
    body = {"model": "gpt-5.5", "usage": usage}
    cached = {"model": "gpt-5.5", "usage": {**usage, "prompt_tokens_details": {"cached_tokens": 8_000}}}
    assert OPENAI.usage(cached) == Usage(10_000, 100, cached_in=8_000)
    full = actual_nano(_answer(body), "gpt-5.5", 0, OPENAI)
    assert full == math.ceil((10_000 * 5.0 + 100 * 30.0) / 1e6 * NANO)
    assert actual_nano(_answer(cached), "gpt-5.5", 0, OPENAI) == math.ceil(
        (2_000 * 5.0 + 8_000 * 0.5 + 100 * 30.0) / 1e6 * NANO
    )
    # the Responses API names them input_tokens_details
    responses = {
        "model": "gpt-5.5",
        "usage": {"input_tokens": 50, "output_tokens": 1, "input_tokens_details": {"cached_tokens": 20}},
    }
    assert OPENAI.usage(responses) == Usage(50, 1, cached_in=20)


def test_bedrock_counts_the_caches_tokens_as_input_and_prices_them_apart() -> None:
    converse = {
        "usage": {"inputTokens": 100, "outputTokens": 5, "cacheReadInputTokens": 900, "cacheWriteInputTokens": 0}
    }
    assert BEDROCK.usage(converse) == Usage(1_000, 5, cached_in=900)
    native = {"usage": {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 40}}
    assert BEDROCK.usage(native) == Usage(50, 5, cache_write=40)


def test_a_request_that_writes_the_cache_reserves_the_cache_write_price() -> None:
    message = {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    plain = _request(message, "/v1/messages")
    marked = _request({**message, "system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]})
    tokens_in = math.ceil(len(marked.body or b"") / 4)
    assert worst_case_nano(marked, ANTHROPIC) == math.ceil((tokens_in * 3.75 + 10 * 15.0) / 1e6 * NANO)
    assert worst_case_nano(plain, ANTHROPIC) == math.ceil(
        (math.ceil(len(plain.body or b"") / 4) * 3.0 + 150) / 1e6 * NANO
    )


def test_summary_costs_count_cache_tokens_and_older_two_figure_stats_alike() -> None:
    models = {"claude-sonnet-4-5": [13_000, 500, 10_000, 2_000], "gpt-4o-mini": [1_000_000, 0]}
    run = provider_costs(models, {"gpt-4o-mini": [1_000_000, 0]})
    direct = (1_000 * 3.0 + 10_000 * 0.3 + 2_000 * 3.75 + 500 * 15.0) / 1e6
    assert run.as_run == pytest.approx(direct + 0.075)
    assert run.all_direct == pytest.approx(direct + 0.15)
