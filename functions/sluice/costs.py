"""Rough cost estimates for the summary. List prices move: these are labelled estimates."""

from __future__ import annotations

# USD per million tokens (input, output), standard tier; the Batch API is half of this.
PROVIDER_PRICES = {
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "text-embedding-3-small": (0.02, 0.0),
}

# us-east-1 list prices
LAMBDA_GB_SECOND = 0.0000166667
SFN_TRANSITION = 0.000025
DDB_WRITE_UNIT = 0.00000125
S3_PUT = 0.000005
SHARD_MEMORY_GB = 1.769


def provider_cost_usd(model: str | None, tokens_in: int, tokens_out: int, *, batch: bool = False) -> float | None:
    if not model or model not in PROVIDER_PRICES:
        return None
    price_in, price_out = PROVIDER_PRICES[model]
    cost = (tokens_in * price_in + tokens_out * price_out) / 1_000_000
    return round(cost / 2 if batch else cost, 6)


def aws_cost_usd(*, requests: int, shards: int, wall_seconds: float) -> float:
    """Shard Lambdas busy for the wall time, one item row write per request, a few transitions
    and S3 requests per shard."""
    running = min(shards, 40) or 1
    lambda_cost = running * wall_seconds * SHARD_MEMORY_GB * LAMBDA_GB_SECOND
    transitions = (10 + 8 * shards) * SFN_TRANSITION
    writes = requests * DDB_WRITE_UNIT
    puts = (6 * shards + 10) * S3_PUT
    return round(lambda_cost + transitions + writes + puts, 6)
