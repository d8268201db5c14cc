"""A local run's Bedrock endpoint (issue 42): where boto3 would send `bedrock-runtime` requests, and
the credentials boto3 would sign them with.

With `AWS_ENDPOINT_URL_BEDROCK_RUNTIME` (or boto3's global `AWS_ENDPOINT_URL`) set, `sluice run
--provider bedrock` sends each Converse and InvokeModel request there, signed (SigV4, service
`bedrock`) with the standard AWS credential chain as it stands when the run starts: explicit
`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`), `AWS_PROFILE`, the shared
files, SSO, a role. They are resolved before the local cloud replaces the process's AWS variables
with its own, and each in-process step signs with them instead of its moto role's. Unset, the run
stays on the built-in simulator. The credentials never leave the signatures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sluice.providers import Signer
from sluice.providers.bedrock.auth import ENDPOINT_VARIABLES, signer

from sluice_local.console import EXIT_AWS, EXIT_USAGE, CliError

DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class UsersEndpoint:
    url: str
    # the variable it came from
    variable: str
    region: str
    sign: Signer
    # where the credentials came from, as botocore names it ("env", "shared-credentials-file", ...)
    credentials_from: str


def endpoint_variable() -> tuple[str, str] | None:
    """(variable, URL) of the runtime endpoint the user set, in boto3's order; None: none is set."""
    for name in ENDPOINT_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            return name, value.rstrip("/")
    return None


class _Held:
    """A session whose credentials are the ones resolved when the run started (a refreshable set
    still refreshes itself), whatever the process's variables say later."""

    def __init__(self, credentials: Any) -> None:
        self._credentials = credentials

    def get_credentials(self) -> Any:
        return self._credentials


def users_endpoint() -> UsersEndpoint | None:
    """The user's Bedrock runtime endpoint and a signer of their credentials, or None for the simulator."""
    found = endpoint_variable()
    if found is None:
        return None
    variable, url = found
    if not url.startswith(("http://", "https://")):
        raise CliError(f"{variable}={url!r} is not an http(s) URL", EXIT_USAGE)
    import boto3

    session = boto3.Session()
    credentials = session.get_credentials()
    if credentials is None:
        raise CliError(
            f"{variable} is set, but no AWS credentials were found to sign the requests with (as boto3 "
            "looks for them: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials, "
            "SSO, a role); set them, or unset it to use the built-in simulator",
            EXIT_AWS,
        )
    region = session.region_name or DEFAULT_REGION
    return UsersEndpoint(url, variable, region, signer(_Held(credentials), region), str(credentials.method))
