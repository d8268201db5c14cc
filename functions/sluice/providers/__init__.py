"""Providers as a seam: for each provider family, its request format and, where the family has
them, its Batch and background APIs, behind small protocols (`format.RequestFormat`,
`batch.BatchApi`, `background.BackgroundApi`).

Only this package knows a provider's wire shape or imports a provider's SDK: the core asks the
family a shard runs against (`ShardSpec.provider`, from `Settings.provider`) through `family`.
"""

from __future__ import annotations

from ..contract import PROVIDERS
from .anthropic import ANTHROPIC
from .background import BackgroundApi, Settled
from .batch import BatchApi, BatchApiOpener, BatchLimits, BatchRow, BatchStatus, BatchTag, BatchUpload
from .format import (
    COMPLETE,
    CUT_SHORT,
    RATE_KINDS,
    REQUESTS,
    TOKENS,
    UNFINISHED,
    Finish,
    ProviderError,
    RateKind,
    RateLimits,
    RequestFormat,
    Unsupported,
    Usage,
)
from .openai import OPENAI

_FORMATS: dict[str, RequestFormat] = {f.name: f for f in (OPENAI, ANTHROPIC)}


def family(name: str) -> RequestFormat:
    """The request format of the provider family `name` (one of `sluice.contract.PROVIDERS`)."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown provider family {name!r}; expected one of {', '.join(PROVIDERS)}") from None


__all__ = [
    "ANTHROPIC",
    "COMPLETE",
    "CUT_SHORT",
    "OPENAI",
    "RATE_KINDS",
    "REQUESTS",
    "TOKENS",
    "UNFINISHED",
    "BackgroundApi",
    "BatchApi",
    "BatchApiOpener",
    "BatchLimits",
    "BatchRow",
    "BatchStatus",
    "BatchTag",
    "BatchUpload",
    "Finish",
    "ProviderError",
    "RateKind",
    "RateLimits",
    "RequestFormat",
    "Settled",
    "Unsupported",
    "Usage",
    "family",
]
