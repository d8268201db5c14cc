"""What `sluice run` says of a provider whose key is unset matches what each request carries."""

from __future__ import annotations

from typing import Any

import pytest
from sluice import providers

import sluice_local.providers as local_providers
from sluice_local.providers import NO_API_KEY, PROVIDER_ENVS, provider


@pytest.mark.parametrize("family", sorted(PROVIDER_ENVS))
def test_a_provider_without_a_key_is_told_the_header_each_request_carries(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = PROVIDER_ENVS[family]
    monkeypatch.setenv(env.base_url_var, "http://127.0.0.1:8000/v1")
    monkeypatch.delenv(env.api_key_var, raising=False)
    checked: list[Any] = []
    monkeypatch.setattr(local_providers, "check_provider", lambda *a, **k: checked.append(a))
    with provider(family, 0.0) as (_url, key, label, simulator):
        assert simulator is None and checked
        (header, value), *_ = providers.family(family).auth_headers(key).items()
        # not "no API key is sent", while a placeholder was
        assert "no API key is sent" not in label
        assert f"{env.api_key_var} is not set: each request carries {header}: {value}" in label
        assert key == NO_API_KEY and value.endswith(NO_API_KEY)
