"""Rough cost estimates for the summary. List prices move: these are labelled estimates."""

from __future__ import annotations

import re

from sluice.contract import STEPS, ShardCosts

# USD per million tokens (input, output), standard tier; the Batch API of each family (OpenAI's,
# Anthropic's Message Batches, Bedrock's batch inference, Gemini's) is half of this, and so is the
# flex tier of OpenAI and Gemini (`service_tier: flex`), where a model has it.
PROVIDER_PRICES = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    # models with flex processing (`sluice.plan.deadline.FLEX_MODELS`), so a deadline can price it;
    # each longer name that the prefix rule would price as its shorter kin has its own price
    "gpt-5": (1.25, 10.00),
    "gpt-5-pro": (15.00, 120.00),
    "gpt-5-mini": (0.25, 2.00),
    "gpt-5-nano": (0.05, 0.40),
    "o4-mini": (1.10, 4.40),
    "o4-mini-deep-research": (2.00, 8.00),
    "text-embedding-3-small": (0.02, 0.0),
    # Anthropic's (anthropic.com/pricing); a dated snapshot takes its alias's price by prefix
    "claude-3-5-haiku-latest": (0.80, 4.00),
    "claude-3-5-haiku-20241022": (0.80, 4.00),
    "claude-3-haiku-20240307": (0.25, 1.25),
    "claude-3-5-sonnet-latest": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
    # Amazon Bedrock's on-demand prices for the same models
    "anthropic.claude-3-haiku-20240307-v1:0": (0.25, 1.25),
    "anthropic.claude-3-5-haiku-20241022-v1:0": (0.80, 4.00),
    # Gemini's (ai.google.dev/gemini-api/docs/pricing; Pro's for prompts up to 200k tokens), its Batch
    # API and flex tier half of these; a preview or dated name takes its model's price by prefix
    "gemini-3-pro-preview": (2.00, 12.00),
    "gemini-3-flash-preview": (0.50, 3.00),
    "gemini-2.5-pro": (1.25, 10.00),
    "gemini-2.5-flash": (0.30, 2.50),
    "gemini-2.5-flash-lite": (0.10, 0.40),
    "gemini-2.0-flash": (0.10, 0.40),
    "gemini-2.0-flash-lite": (0.075, 0.30),
}
# a Bedrock model id's version ("-v1:0", "-v2"), and the geography of a cross-region profile ("us.")
_BEDROCK_VERSION = re.compile(r"-v\d+(:\d+)?$")
_BEDROCK_GEOGRAPHY = re.compile(r"^[a-z]{2,4}\.(?=anthropic\.)")

# us-east-1 list prices
LAMBDA_GB_SECOND = 0.0000166667
SFN_TRANSITION = 0.000025
DDB_WRITE_UNIT = 0.000000625
S3_PUT = 0.000005
# a shard's Lambda (a full vCPU's memory, `contract.FULL_VCPU_MB`) as Lambda bills it, in GiB
SHARD_MEMORY_GB = STEPS["run_shard"].memory_mb / 1024
# checkpoints: one part (a PUT, a stats PUT and a few counter writes) per this many outcomes
CHECKPOINT_EVERY = 1000


def price_per_million(model: str) -> tuple[float, float] | None:
    """USD per million tokens (input, output) at list price; None for a model with no known price."""
    if model in PROVIDER_PRICES:
        return PROVIDER_PRICES[model]
    bedrock = _BEDROCK_GEOGRAPHY.sub("", model)
    if bedrock != model or _BEDROCK_VERSION.search(model):
        # a Bedrock id not named above: the same model at another version or through a profile
        same = [name for name in PROVIDER_PRICES if _BEDROCK_VERSION.sub("", name) == _BEDROCK_VERSION.sub("", bedrock)]
        return PROVIDER_PRICES[same[0]] if same else None
    # answers name dated snapshots ("gpt-4o-mini-2024-07-18"); the longest known prefix prices them
    known = [name for name in PROVIDER_PRICES if model.startswith(name + "-")]
    return PROVIDER_PRICES[max(known, key=len)] if known else None


def provider_cost_usd(tokens_by_model: dict[str, list[int]], *, batch: bool = False) -> float | None:
    """None when no answering model has a known price: better no figure than a wrong one."""
    cost = 0.0
    priced = False
    for model, (tokens_in, tokens_out) in tokens_by_model.items():
        price = price_per_million(model)
        if price is None:
            continue
        priced = True
        cost += (tokens_in * price[0] + tokens_out * price[1]) / 1_000_000
    if not priced:
        return None
    return round(cost / 2 if batch else cost, 6)


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
        model: [max(0, t - b) for t, b in zip(tokens, batch_models.get(model, [0, 0]), strict=True)]
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
