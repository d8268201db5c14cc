"""Sluice core: plain Python that the Lambda handlers and the local runner call.

`sluice.run`, `sluice.Client` and the rest of the Python API (docs/api.md) live with the CLI and
the local cloud, which the Lambda asset does not carry: they are imported on first use only, so
importing the core (as every handler does) imports none of them.
"""

from __future__ import annotations

import importlib
from typing import Any

API_MODULE = "sluice_local.api"
API = (
    "AWSError",
    "Client",
    "DeployedJob",
    "EnvironmentNotFound",
    "InputError",
    "Job",
    "JobInterrupted",
    "NotFound",
    "NotReady",
    "OutputError",
    "ProviderError",
    "SluiceError",
    "UsageError",
    "arun",
    "run",
)


def __getattr__(name: str) -> Any:
    if name in API:
        return getattr(importlib.import_module(API_MODULE), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API})
