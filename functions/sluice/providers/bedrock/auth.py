"""Where Bedrock's runtime is and how a request to it is signed: no key, the function's own AWS
credentials, SigV4 for the `bedrock` service in the endpoint's region.

The endpoint follows boto3's configuration, so a user points Sluice at a proxy (and `sluice run` at
its simulator) the way they would point boto3: `AWS_ENDPOINT_URL_BEDROCK_RUNTIME`, then
`AWS_ENDPOINT_URL`, else the region's public endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

from ..format import Signer

SERVICE: Final = "bedrock"
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "AWS_ENDPOINT_URL")


def endpoint(env: Mapping[str, str], region: str) -> str:
    """The runtime endpoint boto3 would call for `bedrock-runtime` in `region`, given `env`."""
    for name in ENDPOINT_VARIABLES:
        if env.get(name):
            return env[name].rstrip("/")
    return f"https://bedrock-runtime.{region}.amazonaws.com"


def signer(session: Any, region: str) -> Signer:
    """Signs each request with `session`'s credentials as they are when it is sent (a role's are
    refreshed by botocore as they near their expiry). The credentials never leave the signature."""

    def sign(method: str, url: str, headers: Mapping[str, str], body: bytes | None) -> dict[str, str]:
        credentials = session.get_credentials()
        if credentials is None:
            raise RuntimeError("no AWS credentials to sign Bedrock requests with")
        request = AWSRequest(method=method, url=url, data=body or b"", headers=dict(headers))
        SigV4Auth(credentials.get_frozen_credentials(), SERVICE, region).add_auth(request)
        return dict(request.headers.items())

    return sign
