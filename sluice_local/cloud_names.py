"""What the local cloud calls its account, region, functions and table, and the definition that
names them, as CloudFormation would resolve the deployed stack's.

Below both the local cloud (`sluice_local.cloud`) and the IAM it enforces (`sluice_local.iam`),
which each read these names: inside the cloud's package, the IAM's import of them would run the
package, which imports the IAM."""

from __future__ import annotations

from typing import Any

from sluice.contract import STEPS, create_table_request
from sluice.contract.definition import definition_json, substitute

REGION = "us-east-1"
ACCOUNT = "123456789012"
PREFIX = "sluice-local"
# a local run's rows need not outlive the run by much
LOCAL_TTL_DAYS = 7


def create_table(ddb: Any, name: str) -> None:
    """The jobs table as infra/storage.py declares it: pk/sk, and the sparse provider-id index."""
    ddb.create_table(**create_table_request(name))


def function_name(step: str) -> str:
    return f"{PREFIX}-{step.replace('_', '-')}"


def function_arn(step: str) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function_name(step)}"


def local_definition() -> str:
    """The deployed definition with the local functions' ARNs put in, as CloudFormation would."""
    return substitute(definition_json(), {step.placeholder: function_arn(name) for name, step in STEPS.items()})
