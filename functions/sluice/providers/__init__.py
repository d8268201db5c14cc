"""Providers as a seam: for each provider family, its request format and, where the family has
them, its Batch and background APIs, behind small protocols (`format.RequestFormat`,
`batch.BatchApi`, `background.BackgroundApi`).

Only this package knows a provider's wire shape or imports a provider's SDK: the core asks the
family a shard runs against (`ShardSpec.provider`, from `Settings.provider`) through `family`.
"""

from __future__ import annotations

from collections.abc import Callable

from ..contract import PROVIDERS, Mode
from .anthropic import ANTHROPIC
from .background import BackgroundApi, Settled
from .batch import BatchApi, BatchApiOpener, BatchLimits, BatchRow, BatchStatus, BatchTag, BatchUpload
from .bedrock import BEDROCK
from .bedrock.records import batch_refuses as bedrock_batch_refuses
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
    Signer,
    Unsupported,
    Usage,
    token_counts,
)
from .gemini import GEMINI
from .openai import OPENAI

_FORMATS: dict[str, RequestFormat] = {f.name: f for f in (OPENAI, ANTHROPIC, BEDROCK, GEMINI)}
# the families whose batch jobs run some models only: why not, for a model they do not run
_BATCH_REFUSES: dict[str, Callable[[str | None], str | None]] = {BEDROCK.name: bedrock_batch_refuses}
# how each family's shards may send their lines: direct always; batch and background where Sluice
# runs the family's Batch API and background responses (`apis`); only OpenAI's has background responses
_MODES: dict[str, frozenset[str]] = {
    OPENAI.name: frozenset({Mode.DIRECT, Mode.BATCH, Mode.BACKGROUND}),
    ANTHROPIC.name: frozenset({Mode.DIRECT, Mode.BATCH}),
    BEDROCK.name: frozenset({Mode.DIRECT, Mode.BATCH}),
    GEMINI.name: frozenset({Mode.DIRECT, Mode.BATCH}),
}
# the models each family's flex tier (`service_tier: flex`, billed at Batch API prices) takes, with
# their snapshots, as the family's flex guide names them; a job adds others (`sluice-flex-models`).
# A family not named has no such tier
_FLEX_MODELS: dict[str, tuple[str, ...]] = {
    OPENAI.name: ("o3", "o4-mini", "gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-5.4", "gpt-5.5"),
    GEMINI.name: (
        "gemini-3-pro-preview",
        "gemini-3-flash-preview",
        "gemini-2.5-pro",
        "gemini-2.5-flash",
        "gemini-2.5-flash-lite",
    ),
}
# A batch's expected turnaround (created to ended) where Sluice has measured none of the family's:
# Anthropic says most Message Batches end within an hour; OpenAI, Bedrock and Gemini publish no
# typical figure, only a window (24 h; Gemini's target), so Sluice plans on a quarter of it
_TURNAROUND_S: dict[str, float] = {
    OPENAI.name: 6 * 3600.0,
    ANTHROPIC.name: 3600.0,
    BEDROCK.name: 6 * 3600.0,
    GEMINI.name: 6 * 3600.0,
}


def family(name: str) -> RequestFormat:
    """The request format of the provider family `name` (one of `sluice.contract.PROVIDERS`)."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown provider family {name!r}; expected one of {', '.join(PROVIDERS)}") from None


def batch_refuses(name: str, model: str | None) -> str | None:
    """Why the family `name`'s batch jobs cannot run `model` (None: they can, or the family has no
    such limit)."""
    refuses = _BATCH_REFUSES.get(family(name).name)
    return refuses(model) if refuses is not None else None


def flex_models(name: str) -> tuple[str, ...]:
    """The models the flex tier of the family `name` takes; none for a family without one."""
    return _FLEX_MODELS.get(family(name).name, ())


def typical_turnaround_s(name: str) -> float:
    """A batch's expected turnaround on the family `name` before Sluice has measured any."""
    return _TURNAROUND_S[family(name).name]


def modes(name: str) -> frozenset[str]:
    """The modes a shard of the provider family `name` may run in (`Mode`, never `auto`, which
    picks among them)."""
    return _MODES[family(name).name]


__all__ = [
    "ANTHROPIC",
    "BEDROCK",
    "COMPLETE",
    "CUT_SHORT",
    "GEMINI",
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
    "Signer",
    "Unsupported",
    "Usage",
    "batch_refuses",
    "family",
    "flex_models",
    "modes",
    "token_counts",
    "typical_turnaround_s",
]
