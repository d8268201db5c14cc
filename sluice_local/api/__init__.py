"""Sluice from Python: `run` and `arun` a job on this machine, or `Client(env=...)` for a deployed
environment; what the `sluice` command reports as an exit code is a `SluiceError`.

`import sluice` gives these names (`sluice.run`, `sluice.Client`, ...); see docs/api.md.
"""

# ruff: noqa: F401  (imported to be exported: `__all__` is the core's list of these names)

from sluice import API

from sluice_local.api.client import Client, DeployedJob
from sluice_local.api.errors import (
    AWSError,
    EnvironmentNotFound,
    InputError,
    NotFound,
    NotReady,
    OutputError,
    ProviderError,
    SluiceError,
    UsageError,
)
from sluice_local.api.jobs import Job, JobInterrupted
from sluice_local.api.local_run import arun, run

# the names `import sluice` gives, listed once, where the core looks them up
__all__ = list(API)
