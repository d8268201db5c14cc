"""List prices of models, from genai-prices' bundled snapshot, with explicit overrides before it.

genai-prices (pydantic/genai-prices, MIT) is a maintained table of LLM prices across providers:
cached-input and cache-write prices, long-context tiers, and the Batch API's and flex's prices
where the provider publishes them. Only the snapshot inside the installed package is read: its
UpdatePrices (which fetches newer data over the network) is never started, so a Lambda or a test
prices the same whatever the network does, and a newer snapshot comes with a new release of it.

Where the source has no batch or flex price for a model, the family's rule gives it: every
family's Batch API (OpenAI's, Anthropic's Message Batches, Bedrock's batch inference, Gemini's)
is half the standard price, and OpenAI's flex processing is billed at the Batch API's price.

Overrides, checked before the source: `EXPLICIT_PRICES` in code and the environment's
`SLUICE_PRICES`, a JSON object of model -> [input, output] or [input, output, cached input,
cache write], USD per million tokens (`{"my-model": [1.0, 4.0, 0.1, 1.25]}`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

from sluice.contract import parse_prices

PRICES_ENV = "SLUICE_PRICES"
# the index of each count in a model's token list: [input (all of it), output, of the input
# read from the provider's prompt cache, of the input written to it]
TOKENS_IN, TOKENS_OUT, CACHED_IN, CACHE_WRITE = range(4)
TOKEN_FIELDS = 4

# a Bedrock model id's version ("-v1:0", "-v2"), and the geography of a cross-region profile ("us.")
_BEDROCK_VERSION = re.compile(r"-v\d+(:\d+)?$")
_BEDROCK_GEOGRAPHY = re.compile(r"^[a-z]{2,4}\.(?=anthropic\.|amazon\.|meta\.|mistral\.)")
_BEDROCK_VENDOR = re.compile(r"^(anthropic|amazon|meta|mistral|cohere|ai21)\.")
# the source's providers a model name is tried with when its own rules name none (an embedding
# model's name, for one, matches no provider's pattern)
_FALLBACK_PROVIDERS = ("openai", "anthropic", "google")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens. `cached_input` and `cache_write` are None where the model has no
    such price (those tokens cost as input); `tiers` are the prices of a request whose input
    passes each threshold (a long-context price: all its tokens at that rate)."""

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None
    tiers: tuple[tuple[int, Price], ...] = ()

    def usd(self, tokens: Sequence[int]) -> float:
        """What `tokens` ([input, output, cached input, cache write], the last two optional and
        part of the input) cost at this price."""
        counts = list(tokens) + [0] * (TOKEN_FIELDS - len(tokens))
        cached = counts[CACHED_IN]
        written = counts[CACHE_WRITE]
        plain = max(0, counts[TOKENS_IN] - cached - written)
        cached_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input if self.cache_write is None else self.cache_write
        return (
            plain * self.input + cached * cached_price + written * write_price + counts[TOKENS_OUT] * self.output
        ) / 1_000_000

    def for_request(self, tokens_in: int) -> Price:
        """The price of one request with `tokens_in` input tokens (its long-context tier, if any)."""
        for start, price in reversed(self.tiers):
            if tokens_in > start:
                return price
        return self

    def scaled(self, factor: float) -> Price:
        def times(value: float | None) -> float | None:
            return None if value is None else value * factor

        return Price(
            self.input * factor,
            self.output * factor,
            times(self.cached_input),
            times(self.cache_write),
            tuple((start, tier.scaled(factor)) for start, tier in self.tiers),
        )


@dataclass(frozen=True, slots=True)
class ModelPrices:
    """A model's price at each tier Sluice sends at: standard, the Batch API's, and flex (where
    the source prices flex; else the batch price, as OpenAI bills it). `source` names where the
    prices came from: "genai-prices <model id>", or "override"."""

    standard: Price
    batch: Price
    flex: Price
    source: str


def price_tuple(raw: Sequence[float]) -> ModelPrices:
    """An explicit price: (input, output) or (input, output, cached input, cache write)."""
    values = [float(v) for v in raw]
    if not 2 <= len(values) <= TOKEN_FIELDS or any(v < 0 for v in values):
        raise ValueError(f"a price is [input, output] or [input, output, cached input, cache write], not {raw!r}")
    values += [None] * (TOKEN_FIELDS - len(values))  # type: ignore[list-item]
    standard = Price(values[0], values[1], values[2], values[3])
    half = standard.scaled(0.5)
    return ModelPrices(standard, half, half, "override")


@lru_cache(maxsize=8)
def env_overrides(raw: str) -> Mapping[str, ModelPrices]:
    """`SLUICE_PRICES` read: ValueError says what is wrong with it."""
    try:
        return {model: price_tuple(values) for model, values in parse_prices(raw).items()}
    except ValueError as exc:
        raise ValueError(f"{PRICES_ENV}: {exc} (USD per million tokens)") from None


def lookup(model: str, explicit: Mapping[str, Sequence[float]]) -> ModelPrices | None:
    """The prices of `model`: the environment's override, an explicit entry (by name or as the
    longest entry its name extends, "gpt-4o-mini-2024-07-18" as "gpt-4o-mini"), else the source's."""
    if not model:
        return None
    overrides = env_overrides(os.environ.get(PRICES_ENV, ""))
    name = _by_name(model, overrides)
    if name is not None:
        return overrides[name]
    name = _by_name(model, explicit)
    if name is not None:
        return price_tuple(explicit[name])
    return source_prices(model)


def _by_name(model: str, table: Mapping[str, object]) -> str | None:
    if model in table:
        return model
    known = [name for name in table if model.startswith(name + "-")]
    return max(known, key=len) if known else None


@lru_cache(maxsize=1024)
def source_prices(model: str) -> ModelPrices | None:
    """The model's prices in genai-prices' bundled snapshot; None for a model it does not price."""
    found = _source_model(model)
    if found is None:
        return None
    provider_id, info = found
    now = datetime.now(tz=UTC)
    standard = _price(info.get_prices(now))
    if standard is None:
        return None
    batch = _variant(info, now, {"processing": "batch"}, standard) or standard.scaled(0.5)
    flex = _variant(info, now, {"service_tier": "flex"}, standard) or batch
    return ModelPrices(standard, batch, flex, f"genai-prices {provider_id}/{info.id}")


def _source_model(model: str) -> tuple[str, Any] | None:
    snapshot = _snapshot()
    bedrock = _BEDROCK_GEOGRAPHY.sub("", model)
    candidates: list[str | None] = [None, *_FALLBACK_PROVIDERS]
    if _BEDROCK_VENDOR.match(bedrock) or _BEDROCK_VERSION.search(model):
        candidates = ["aws"]
    for provider_id in candidates:
        try:
            provider, info = snapshot.find_provider_model(model, None, provider_id, None)
        except LookupError:
            continue
        return provider.id, info
    return None


@lru_cache(maxsize=1)
def _snapshot() -> Any:
    """The bundled data only (`genai_prices.calc_price` would read one UpdatePrices fetched),
    imported on the first price asked: a step that prices nothing does not load it."""
    from genai_prices.data import providers
    from genai_prices.data_snapshot import DataSnapshot

    return DataSnapshot(providers=providers, from_auto_update=False)


def _variant(info: Any, now: datetime, context: dict[str, str], standard: Price) -> Price | None:
    """The model's price under `context` where the source gives one of its own."""
    price = _price(info.get_prices(now, context))
    return price if price is not None and price != standard else None


def _price(model_price: Any) -> Price | None:
    base_in, tiers_in = _tiered(getattr(model_price, "input_mtok", None))
    base_out, tiers_out = _tiered(getattr(model_price, "output_mtok", None))
    if base_in is None:
        return None
    cached, tiers_cached = _tiered(getattr(model_price, "cache_read_mtok", None))
    written, tiers_written = _tiered(getattr(model_price, "cache_write_mtok", None))
    base = Price(base_in, base_out or 0.0, cached, written)
    starts = sorted(set(tiers_in) | set(tiers_out) | set(tiers_cached) | set(tiers_written))
    tiers = tuple(
        (
            start,
            Price(
                _at(tiers_in, start, base_in),
                _at(tiers_out, start, base.output),
                _at(tiers_cached, start, cached),
                _at(tiers_written, start, written),
            ),
        )
        for start in starts
    )
    return replace(base, tiers=tiers)


def _at(tiers: Mapping[int, float], start: int, base: Any) -> Any:
    """A price's rate from `start` input tokens on: its highest tier that begins by then."""
    begun = [at for at in tiers if at <= start]
    return tiers[max(begun)] if begun else base


def _tiered(value: Any) -> tuple[float | None, dict[int, float]]:
    if value is None:
        return None, {}
    if isinstance(value, Decimal | int | float):
        return float(value), {}
    return float(value.base), {int(tier.start): float(tier.price) for tier in value.tiers}
