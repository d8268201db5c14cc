"""Secrets are read through Powertools' cache on the function's own client."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parameters import SecretsProvider
from sluice.contract import Settings
from sluice_handlers.runtime import Runtime, read_secret


class Secrets:
    """A Secrets Manager client holding one secret that can be rotated."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.reads = 0

    def get_secret_value(self, SecretId: str, **_: Any) -> dict[str, Any]:
        self.reads += 1
        return {"ARN": SecretId, "SecretString": self.value}


@pytest.mark.slow
def test_a_secret_is_read_once_within_max_age_and_again_after_a_rotation() -> None:
    client = Secrets("whsec_one")
    secrets = SecretsProvider(boto3_client=client)  # type: ignore[arg-type]

    assert [read_secret(secrets, "arn:s", max_age=1) for _ in range(3)] == ["whsec_one"] * 3
    assert client.reads == 1
    client.value = "whsec_two"
    assert read_secret(secrets, "arn:s", max_age=1) == "whsec_one"
    time.sleep(1.1)
    assert read_secret(secrets, "arn:s", max_age=1) == "whsec_two"
    assert client.reads == 2


def runtime(client: Secrets) -> Runtime:
    settings = Settings(bucket="b", table="t", provider_base_url="http://p", api_key_secret_arn="arn:key")
    secrets = SecretsProvider(boto3_client=client)  # type: ignore[arg-type]
    return Runtime(settings=settings, s3=None, events=None, store=None, secrets=secrets, sfn=None)  # type: ignore[arg-type]


def test_the_api_key_placeholder_is_one_clear_error_that_does_not_show_the_value() -> None:
    with pytest.raises(RuntimeError, match="the provider API key secret is not set") as raised:
        _ = runtime(Secrets("PLACEHOLDER-set-me")).api_key
    assert "PLACEHOLDER-set-me" not in str(raised.value)


def test_the_api_key_is_read_once_for_many_invocations() -> None:
    client = Secrets("sk-live")
    built = runtime(client)
    assert {built.api_key for _ in range(5)} == {"sk-live"}
    assert client.reads == 1
