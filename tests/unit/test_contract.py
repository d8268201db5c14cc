"""The settings the steps read back are the ones infra and the local cloud wrote."""

from __future__ import annotations

import pytest
from sluice.contract import STEPS, Settings, SettingsError, WebhookSettings, manifest_key
from sluice.lines import parse_line
from sluice.model import Request

REQUIRED = {"bucket": "b", "table": "t", "provider_base_url": "http://p", "api_key_secret_arn": "arn:s"}


def test_settings_survive_the_environment_both_ways() -> None:
    chosen = Settings(
        **REQUIRED,
        default_model="gpt-4o-mini",
        default_mode="auto",
        concurrency=7,
        request_timeout_s=2.5,
        rpm=600,
        on_batch_incomplete="error",
        max_error_rate=0.01,
    )
    assert Settings.from_env(chosen.to_env()) == chosen
    assert Settings.from_env(Settings(**REQUIRED).to_env()) == Settings(**REQUIRED)
    assert "SLUICE_DEFAULT_MODEL" not in Settings(**REQUIRED).to_env()
    webhook = WebhookSettings(table="t", webhook_secret_arn="arn:w", ttl_days=3)
    assert WebhookSettings.from_env(webhook.to_env()) == webhook


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SLUICE_BUCKET", "", "missing required setting SLUICE_BUCKET"),
        ("SLUICE_DEFAULT_MODE", "fast", "SLUICE_DEFAULT_MODE='fast'; expected one of direct, background, batch, auto"),
        ("SLUICE_CONCURRENCY", "0", "SLUICE_CONCURRENCY must be positive, got 0"),
        ("SLUICE_REQUEST_TIMEOUT_S", "soon", "SLUICE_REQUEST_TIMEOUT_S='soon' is not a float"),
        ("SLUICE_RPM", "-1", "SLUICE_RPM='-1' is not a whole number"),
        ("SLUICE_MAX_ERROR_RATE", "2", "SLUICE_MAX_ERROR_RATE='2'"),
        ("SLUICE_ON_BATCH_INCOMPLETE", "drop", "expected one of direct, error"),
    ],
)
def test_a_bad_variable_is_named(variable: str, value: str, message: str) -> None:
    env = {**Settings(**REQUIRED).to_env(), variable: value}
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env(env)


def test_every_step_has_its_handler_module() -> None:
    import importlib

    for step in STEPS.values():
        assert callable(importlib.import_module(step.module).handler), step.name
    assert STEPS["run_shard"].placeholder == "RunShardFunctionArn"
    assert manifest_key("j-1") == "jobs/j-1/manifest.json"


def test_the_default_model_fills_in_only_a_line_that_names_none() -> None:
    def model(raw: bytes, **kw: str) -> str:
        parsed = parse_line(raw, 1, **kw)  # type: ignore[arg-type]
        assert isinstance(parsed, Request) and parsed.body is not None
        import orjson

        return str(orjson.loads(parsed.body)["model"])

    unnamed = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}'
    named = unnamed.replace(b'{"messages"', b'{"model": "gpt-4o", "messages"')
    assert model(unnamed, default_model="gpt-4o-mini") == "gpt-4o-mini"
    assert model(named, default_model="gpt-4o-mini") == "gpt-4o"
    # the job's own `sluice-model` replaces every line's, the default included
    assert model(unnamed, model="o3", default_model="gpt-4o-mini") == "o3"
    assert model(named, model="o3", default_model="gpt-4o-mini") == "o3"
