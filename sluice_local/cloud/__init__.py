"""The embedded default: the deployed state machine and Lambda code, run on moto in-process.

moto runs the Amazon States Language through its interpreter; its Lambda service would need
Docker to run functions, so the interpreter's Lambda call is routed to the same handler
modules that the CDK stack deploys, with a context that reports the remaining time.

The names the local cloud gives its account and resources (`sluice_local.cloud_names`, outside the
package: `sluice_local.iam` reads them, and the cloud reads the IAM), the Lambda runtime the
handlers meet (`lambdas`), the settings a local run chooses (`settings`), the cloud itself
(`local_cloud`) and a job run through it (`jobs`). Import from the package itself:
`from sluice_local.cloud import LocalCloud, run_job`.
"""

from __future__ import annotations

from sluice_local.cloud.jobs import JobRun, run_job
from sluice_local.cloud.lambdas import Invocation, LambdaContext, LambdaOutOfMemory, LambdaTimeout, RunInterrupted
from sluice_local.cloud.local_cloud import LocalCloud
from sluice_local.cloud.settings import LocalSettings
from sluice_local.cloud_names import (
    ACCOUNT,
    LOCAL_TTL_DAYS,
    PREFIX,
    REGION,
    create_table,
    function_arn,
    function_name,
    local_definition,
)

__all__ = [
    "ACCOUNT",
    "LOCAL_TTL_DAYS",
    "PREFIX",
    "REGION",
    "Invocation",
    "JobRun",
    "LambdaContext",
    "LambdaOutOfMemory",
    "LambdaTimeout",
    "LocalCloud",
    "LocalSettings",
    "RunInterrupted",
    "create_table",
    "function_arn",
    "function_name",
    "local_definition",
    "run_job",
]
