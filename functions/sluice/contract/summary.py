"""What the job's summary says beyond its counts: a provider's refusal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .state import strict

# The summary's key for a provider that refused a shard's requests (issue 31): `null`, or a
# `ProviderRefused` as a JSON object. The CLI exits 8 when it is set.
PROVIDER_REFUSED = "provider_refused"


@dataclass(frozen=True)
class ProviderRefused:
    """Why a shard stopped sending: the first answers of its run were all this one non-retryable
    error. `status` is the HTTP status, `message` the provider's error message, `cause` the likely
    cause in plain words, `lines` the lines not sent because of it (in the summary, the job's)."""

    status: int
    message: str
    cause: str
    lines: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProviderRefused:
        return strict(cls, data, PROVIDER_REFUSED)
