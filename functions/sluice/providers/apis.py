"""Which provider family a deployment talks to: its Batch and background APIs.

OpenAI's family (and what copies its API: sference, KiosAPI, vLLM, the simulator) has both;
Anthropic's has its Message Batches, Bedrock its batch inference jobs, Gemini its Batch API. For a family without one
(`sluice.providers.modes`) these raise rather than hand over another's. The handlers pass what
these return to the runners, which never ask which family it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from ..contract import DEFAULT_PROVIDER, Mode, Settings
from . import modes
from .anthropic import ANTHROPIC
from .background import BackgroundApi
from .batch import BatchApi, BatchApiOpener, BatchLimits
from .bedrock import BEDROCK
from .gemini import GEMINI
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
    if provider == GEMINI.name:
        from .gemini.batch import opener as gemini_opener

        return gemini_opener(base_url, api_key, timeout_s=timeout_s, limits=limits)

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[BatchApi]:
        from .openai.batch import SDK_MAX_RETRIES, opener

        retries = SDK_MAX_RETRIES if max_retries is None else max_retries
        async with opener(base_url, api_key, timeout_s=timeout_s, limits=limits, max_retries=retries)() as api:
            yield api

    return opened


def batch_api_for(
    settings: Settings, api_key: str, *, s3: Any = None, bedrock: Callable[[], Any] | None = None
) -> BatchApiOpener:
    """The Batch API the settings name, within their limits for one batch. Bedrock's needs the
    job bucket's `s3` client and a factory of `bedrock` clients (the function's session's, or the
    local cloud's emulation), and signs with the function's role: it has no key."""
    _require(settings.provider, Mode.BATCH, "Batch API")
    if settings.provider == BEDROCK.name:
        return _bedrock(settings, s3, bedrock)
    return batch_api(
        settings.provider_base_url,
        api_key,
        timeout_s=settings.request_timeout_s,
        limits=batch_limits(settings),
        provider=settings.provider,
    )


def batch_limits(settings: Settings) -> BatchLimits:
    """What one batch of the settings' family may hold: the family's own limits, within the
    deployment's `batch_max_requests` and `batch_max_bytes` (an OpenAI-compatible server's limits
    are those settings). Plan cuts a batch job's shards to them, so that a shard is one batch
    wherever its lines share an endpoint and model; the Batch API opened for a run has the same."""
    _require(settings.provider, Mode.BATCH, "Batch API")
    asked = BatchLimits(max_records=settings.batch_max_requests, max_bytes=settings.batch_max_bytes)
    if settings.provider == BEDROCK.name:
        from .bedrock.batch import LIMITS, held_jobs

        return replace(
            LIMITS,
            max_records=min(asked.max_records, LIMITS.max_records),
            max_bytes=min(asked.max_bytes, LIMITS.max_bytes),
            max_jobs=held_jobs(settings.bedrock_batch_jobs_quota),
        )
    if settings.provider == ANTHROPIC.name:
        from .anthropic.batch import within_limits

        return within_limits(asked)
    if settings.provider == GEMINI.name:
        from .gemini.batch import within_limits as gemini_limits

        return gemini_limits(asked)
    return asked


def batch_api_to_cancel(
    provider: str,
    base_url: str,
    api_key: str,
    *,
    timeout_s: float,
    max_retries: int,
    s3: Any = None,
    bedrock: Callable[[], Any] | None = None,
) -> BatchApiOpener:
    """The Batch API a cancel opens, with the caller's credentials: Bedrock's through the caller's
    `bedrock` clients (a cancel creates no job, so needs neither the job bucket nor the service
    role), any other family's at `base_url` with its key."""
    if provider == BEDROCK.name:
        if bedrock is None:
            raise ValueError("cancelling Bedrock batch inference jobs needs a bedrock client")
        from .bedrock.batch import opener

        return opener(bedrock, s3, bucket="", role_arn="")
    return batch_api(base_url, api_key, timeout_s=timeout_s, max_retries=max_retries, provider=provider)


def bedrock_clients(session: Any) -> Callable[[], Any] | None:
    """Makes `bedrock` clients (batch inference jobs) from a boto3 session, when a run opens the API."""
    if session is None:
        return None
    return lambda: session.client("bedrock")


def _bedrock(settings: Settings, s3: Any, bedrock: Callable[[], Any] | None) -> BatchApiOpener:
    from .bedrock.batch import opener

    if s3 is None or bedrock is None or not settings.bedrock_batch_role_arn:
        raise ValueError("Bedrock batch inference needs the job bucket, a bedrock client and the stack's service role")
    return opener(
        bedrock,
        s3,
        bucket=settings.bucket,
        role_arn=settings.bedrock_batch_role_arn,
        limits=batch_limits(settings),
        name_prefix=settings.bedrock_job_prefix,
    )


def background_api(provider: str = DEFAULT_PROVIDER) -> BackgroundApi:
    """The background responses of the provider family `provider`."""
    _require(provider, Mode.BACKGROUND, "background responses")
    return OpenAIBackground()


def _require(provider: str, mode: str, what: str) -> None:
    if mode not in modes(provider):
        raise ValueError(f"the {provider} provider has no {what} Sluice can run ({mode} mode)")
