"""Which families sign each request with the function's AWS credentials instead of sending an API
key, and where their endpoint is: the handlers ask here, and never name a family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..contract import SIGNED_PROVIDERS
from .bedrock import BEDROCK, auth
from .format import Signer


def signed(provider: str, session: Any, env: Mapping[str, str]) -> tuple[str, Signer] | None:
    """For a family that signs its requests: its endpoint, as boto3's configuration in `env` gives it,
    and the signer of `session`'s credentials (a boto3 Session). None: the family sends an API key to
    the settings' base URL."""
    if provider != BEDROCK.name:
        return None
    region = session.region_name or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region:
        raise RuntimeError("Bedrock's endpoint and signature need an AWS region; none is configured")
    return auth.endpoint(env, region), auth.signer(session, region)


def keyless(provider: str) -> bool:
    """Whether the family signs its requests, so that an environment of it holds no API key."""
    return provider in SIGNED_PROVIDERS
