"""Each step reads only the settings sets it declares: from only their variables, failing on a
missing or bad one of its own, and loudly if it reads another set's setting."""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import fields
from typing import Any

import boto3
import pytest
from sluice.contract import (
    READS,
    SETTING_DEFAULTS,
    STEPS,
    WEBHOOK,
    JobTable,
    Settings,
    SettingsError,
    SettingsSet,
    WebhookSettings,
    variables_read,
)
from sluice_handlers.runtime import Runtime

from sluice_local.cloud import LocalCloud
from sluice_local.cloud.lambdas import step_environment

REQUIRED: dict[str, Any] = {"bucket": "b", "table": "t", "provider_base_url": "http://p", "api_key_secret_arn": "arn:s"}
EVERY = Settings(**REQUIRED, default_model="gpt-4o-mini", event_bus="jobs", concurrency=7).to_env()
SETS = [base for base in Settings.__mro__[1:] if issubclass(base, SettingsSet) and base is not SettingsSet]


def test_every_setting_is_in_exactly_one_set_with_its_own_parser() -> None:
    names = [f.name for s in SETS for f in fields(s)]
    assert sorted(names) == sorted(f.name for f in fields(Settings))
    assert all(callable(f.metadata["parser"]) for f in fields(Settings))
    assert set(READS) == {*STEPS, WEBHOOK.name}
    assert {s for sets in READS.values() for s in sets} >= set(SETS), "a set no step reads is dead"
    # the webhook receiver's settings are the sets it declares
    assert WebhookSettings.variables() == variables_read(WEBHOOK.name)


def test_a_step_reads_only_its_own_sets_and_another_sets_setting_fails_loudly() -> None:
    notify = Settings.reading(READS["notify"], EVERY)
    assert (notify.table, notify.event_bus) == ("t", "jobs")
    assert notify.to_env().keys() == {"SLUICE_TABLE", "SLUICE_TTL_DAYS", "SLUICE_EVENT_BUS"}
    with pytest.raises(SettingsError, match="SLUICE_BUCKET is a JobBucket setting, which this step does not read"):
        _ = notify.bucket
    with pytest.raises(SettingsError, match="SLUICE_CONCURRENCY is a JobDefaults setting"):
        _ = notify.concurrency
    with pytest.raises(AttributeError):
        _ = notify.no_such_setting  # type: ignore[attr-defined]
    assert "bucket" not in repr(notify)
    # all sets at once is the whole of the settings
    assert Settings.reading(SETS, EVERY) == Settings.from_env(EVERY)


def test_a_step_fails_fast_on_its_own_variables_only() -> None:
    broken = {**EVERY, "SLUICE_CONCURRENCY": "0"}
    assert Settings.reading(READS["take_slot"], broken).max_shards_in_flight == 0
    with pytest.raises(SettingsError, match="SLUICE_CONCURRENCY must be positive, got 0"):
        Settings.reading(READS["plan"], broken)
    without_key = {k: v for k, v in EVERY.items() if k != "SLUICE_API_KEY_SECRET_ARN"}
    assert Settings.reading(READS["plan"], without_key).provider_base_url == "http://p"
    with pytest.raises(SettingsError, match="missing required setting SLUICE_API_KEY_SECRET_ARN"):
        Settings.reading(READS["run_shard"], without_key)
    with pytest.raises(SettingsError, match="missing required setting SLUICE_TABLE"):
        Settings.reading((JobTable,), {})


def test_a_copy_with_changes_keeps_only_the_sets_it_holds() -> None:
    merge = Settings.reading(READS["merge"], EVERY)
    moved = merge.but(provider_base_url="https://bedrock-runtime.example")
    assert (moved.provider_base_url, moved.cache_provider_name) == ("https://bedrock-runtime.example",) * 2
    assert merge.provider_base_url == "http://p"
    with pytest.raises(SettingsError, match="SLUICE_EVENT_BUS"):
        _ = moved.event_bus


def test_a_runtime_reads_its_steps_sets_from_its_own_environment() -> None:
    session = boto3.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    only_slots = {k: v for k, v in EVERY.items() if k in variables_read("take_slot")}
    built = Runtime.from_session(session, READS["take_slot"], only_slots)
    assert built.settings.to_env() == only_slots and built.sign is None
    with pytest.raises(SettingsError, match="SLUICE_API_KEY_SECRET_ARN"):
        _ = built.api_key
    # a step that does not read the provider never signs for it, even in a Bedrock environment
    bedrock = {**only_slots, "SLUICE_PROVIDER": "bedrock"}
    assert Runtime.from_session(session, READS["take_slot"], bedrock).sign is None
    assert Runtime.from_session(session, READS["run_shard"], {**EVERY, "SLUICE_PROVIDER": "bedrock"}).sign


def test_every_handler_loads_the_runtime_of_its_own_step() -> None:
    for step in STEPS.values():
        source = inspect.getsource(importlib.import_module(step.module))
        named = [
            call.args[1].value
            for call in ast.walk(ast.parse(source))
            if isinstance(call, ast.Call)
            and getattr(call.func, "id", None) == "runtime"
            and isinstance(call.args[1], ast.Constant)
        ]
        assert named and set(named) == {step.name}, step.name


def test_the_local_cloud_gives_each_step_the_variables_infra_gives_it() -> None:
    """Infra gives a function its sets' variables, less an optional one left unset
    (tests/infra/test_functions.py); the local cloud's in-process functions get the same."""
    cloud = LocalCloud(provider_base_url="http://127.0.0.1:1/v1", api_key="sk-local")
    process = {**cloud.environment(), "PATH": "/bin", "SLUICE_ENV": "local"}
    unset_optional = {Settings.variable(name) for name, default in SETTING_DEFAULTS.items() if default is None}
    settings_variables = Settings.variables() | WebhookSettings.variables()
    for step in READS:
        given = step_environment(step, process)
        ours = given.keys() & settings_variables
        assert ours <= variables_read(step), step
        assert variables_read(step) - ours <= unset_optional, step
        assert given.keys() - ours == process.keys() - settings_variables, "everything else is passed as it is"
