"""Which provider family a deployment talks to: its Batch and background APIs.

OpenAI's family (and what copies its API: sference, KiosAPI, vLLM, the simulator) has both;
Anthropic's has its Message Batches. For a family without one (`sluice.providers.modes`) these
raise rather than hand over another's. The handlers pass what these return to the runners, which
never ask which family it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from ..contract import DEFAULT_PROVIDER, Mode, Settings
from . import modes
from .anthropic import ANTHROPIC
from .background import BackgroundApi
from .batch import BatchApi, BatchApiOpener, BatchLimits
from .openai.background import OpenAIBackground


def batch_api(
    base_url: str,
    api_key: str,
    *,
    timeout_s: float,
    limits: BatchLimits | None = None,
    max_retries: int | None = None,
    provider: str = DEFAULT_PROVIDER,
) -> BatchApiOpener:
    """Opens the Batch API of the family `provider` at `base_url` for one run. OpenAI's SDK takes
    about a second to import, so it is imported when a run opens the API, not by every step that
    builds a shard context."""
    _require(provider, Mode.BATCH, "Batch API")
    if provider == ANTHROPIC.name:
        from .anthropic.batch import opener as anthropic_opener

        return anthropic_opener(base_url, api_key, timeout_s=timeout_s, limits=limits)

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[BatchApi]:
        from .openai.batch import SDK_MAX_RETRIES, opener

        retries = SDK_MAX_RETRIES if max_retries is None else max_retries
        async with opener(base_url, api_key, timeout_s=timeout_s, limits=limits, max_retries=retries)() as api:
            yield api

    return opened


def batch_api_for(settings: Settings, api_key: str) -> BatchApiOpener:
    """The Batch API the settings name, within their limits for one batch."""
    limits = BatchLimits(max_records=settings.batch_max_requests, max_bytes=settings.batch_max_bytes)
    return batch_api(
        settings.provider_base_url,
        api_key,
        timeout_s=settings.request_timeout_s,
        limits=limits,
        provider=settings.provider,
    )


def background_api(provider: str = DEFAULT_PROVIDER) -> BackgroundApi:
    """The background responses of the provider family `provider`."""
    _require(provider, Mode.BACKGROUND, "background responses")
    return OpenAIBackground()


def _require(provider: str, mode: str, what: str) -> None:
    if mode not in modes(provider):
        raise ValueError(f"the {provider} provider has no {what} Sluice can run ({mode} mode)")
