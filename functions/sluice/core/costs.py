"""Cost estimates for the summary, the budget and the deadline plan. List prices move: these are
labelled estimates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sluice.contract import STEPS, ShardCosts
from sluice.core.prices import TOKEN_FIELDS, ModelPrices, Price, lookup

# Explicit prices, USD per million tokens: (input, output) or (input, output, cached input, cache
# write), before the maintained source (`sluice.core.prices`, genai-prices' snapshot) for a model
# it does not price or prices wrongly; a longer name ("gpt-4o-mini-2024-07-18") takes its
# longest entry's. The Batch API (and OpenAI's flex) is half of an explicit price.
PROVIDER_PRICES: dict[str, tuple[float, ...]] = {}
# where a refusal sends the user to look for a model's price
PRICED_MODELS = (
    "priced are the models genai-prices' data names, with their dated snapshots, and those the "
    'environment\'s price overrides give (docs/providers.md, "Prices")'
)

# us-east-1 list prices
LAMBDA_GB_SECOND = 0.0000166667
SFN_TRANSITION = 0.000025
DDB_WRITE_UNIT = 0.000000625
S3_PUT = 0.000005
# a shard's Lambda (a full vCPU's memory, `contract.FULL_VCPU_MB`) as Lambda bills it, in GiB
SHARD_MEMORY_GB = STEPS["run_shard"].memory_mb / 1024
# checkpoints: one part (a PUT, a stats PUT and a few counter writes) per this many outcomes
CHECKPOINT_EVERY = 1000


def model_prices(model: str) -> ModelPrices | None:
    """The model's list prices (standard, batch, flex); None for a model with no known price."""
    return lookup(model, PROVIDER_PRICES)


def price_per_million(model: str, tier: str = "standard") -> Price | None:
    """USD per million tokens at `tier` ("standard", "batch" or "flex"); None for a model with no
    known price."""
    prices = model_prices(model)
    if prices is None:
        return None
    return {"batch": prices.batch, "flex": prices.flex}.get(tier, prices.standard)


def provider_cost_usd(tokens_by_model: Mapping[str, Sequence[int]], *, batch: bool = False) -> float | None:
    """What each model's tokens ([input, output, cached input, cache write]) cost at list price,
    or the Batch API's with `batch`. None when no answering model has a known price: better no
    figure than a wrong one. Summed tokens take a model's base price, not a long-context tier's."""
    cost = 0.0
    priced = False
    for model, tokens in tokens_by_model.items():
        price = price_per_million(model, "batch" if batch else "standard")
        if price is None:
            continue
        priced = True
        cost += price.usd(tokens)
    if not priced:
        return None
    return round(cost, 6)


def padded(tokens: Sequence[int]) -> list[int]:
    """A model's token counts with every field (older stats hold only [input, output])."""
    return list(tokens) + [0] * (TOKEN_FIELDS - len(tokens))


def aws_cost_usd(*, requests: int, shards: int, wall_seconds: float, failed: int = 0) -> float:
    """Shard Lambdas busy for the wall time, a few transitions and S3 requests per shard, and
    DynamoDB writes per checkpoint (direct mode keeps item rows for failed lines only)."""
    running = min(shards, 40) or 1
    lambda_cost = running * wall_seconds * SHARD_MEMORY_GB * LAMBDA_GB_SECOND
    transitions = (10 + 9 * shards) * SFN_TRANSITION
    parts = requests // CHECKPOINT_EVERY + shards
    writes = (failed + 3 * parts + 3 * shards) * DDB_WRITE_UNIT
    puts = (2 * parts + 6 * shards + 10) * S3_PUT
    return round(lambda_cost + transitions + writes + puts, 6)


def provider_costs(models: dict[str, list[int]], batch_models: dict[str, list[int]]) -> ShardCosts:
    """The provider estimate as run (rows a batch answered at the batch rate, the rest direct)
    next to what the same tokens cost all direct and all batch."""
    direct_models = {
        model: [max(0, t - b) for t, b in zip(padded(tokens), padded(batch_models.get(model, [])), strict=True)]
        for model, tokens in models.items()
    }
    direct = provider_cost_usd(direct_models)
    batched = provider_cost_usd(batch_models, batch=True)
    as_run = None if direct is None and batched is None else round((direct or 0.0) + (batched or 0.0), 6)
    return ShardCosts(
        as_run=as_run,
        all_direct=provider_cost_usd(models),
        all_batch=provider_cost_usd(models, batch=True),
    )
