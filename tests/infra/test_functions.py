from __future__ import annotations

import re

from infra.definition import FUNCTION_PLACEHOLDERS
from infra.functions import FULL_VCPU_MB
from tests.infra.conftest import ROOT, Synthesis

# The seven of the original design plus the ones the definition has grown since.
HANDLERS = {step: f"handlers.{step}.handler" for step in FUNCTION_PLACEHOLDERS}
SHORT_STEPS = ("notify", "await_shard")
CONFIGURED = {
    "SLUICE_BUCKET",
    "SLUICE_TABLE",
    "SLUICE_PROVIDER_BASE_URL",
    "SLUICE_API_KEY_SECRET_ARN",
    "SLUICE_DEFAULT_MODE",
    "SLUICE_CONCURRENCY",
    "SLUICE_MAP_CONCURRENCY",
    "SLUICE_MAX_ATTEMPTS",
    "SLUICE_REQUEST_TIMEOUT_S",
    "SLUICE_SHARD_LINES",
    "SLUICE_TTL_DAYS",
    "SLUICE_EVENT_BUS",
}


def step_functions(synthesis: Synthesis, env: str) -> dict[str, dict]:
    """Our step Lambdas by step name (CDK's own custom-resource Lambdas left out)."""
    functions = synthesis.resources(env, "AWS::Lambda::Function").values()
    ours = {}
    for function in functions:
        handler = function["Properties"].get("Handler", "")
        if handler.startswith("handlers."):
            ours[handler.split(".")[1]] = function
    return ours


def test_python_312_functions_one_per_step(synthesis: Synthesis, env: str) -> None:
    functions = step_functions(synthesis, env)
    assert {step: f["Properties"]["Handler"] for step, f in functions.items()} == HANDLERS
    assert {"plan", "run_shard", "submit", "collect", "merge", "notify", "mark_failed"} <= set(functions)
    for function in functions.values():
        props = function["Properties"]
        assert props["Runtime"] == "python3.12"
        assert props["Architectures"] == ["x86_64"]
        assert "LoggingConfig" in props and "LogGroup" in props["LoggingConfig"]
    codes = {str(f["Properties"]["Code"]) for f in functions.values()}
    assert len(codes) == 1, "all steps share one code asset"


def test_sizes_and_timeouts(synthesis: Synthesis, env: str) -> None:
    functions = step_functions(synthesis, env)
    for step, function in functions.items():
        props = function["Properties"]
        assert props["Timeout"] == (30 if step in SHORT_STEPS else 900), step
        assert props["MemorySize"] == (FULL_VCPU_MB if step == "run_shard" else 1024), step


def test_environment_matches_what_settings_reads(synthesis: Synthesis, env: str) -> None:
    # Settings with a default may stay unset; a variable settings never reads is a typo.
    settings_source = (ROOT / "functions" / "sluice" / "settings.py").read_text()
    read_by_settings = set(re.findall(r"\"(SLUICE_[A-Z0-9_]+)\"", settings_source))
    required = set(re.findall(r"need\(\"(SLUICE_[A-Z0-9_]+)\"\)", settings_source))
    assert required >= {"SLUICE_BUCKET", "SLUICE_TABLE", "SLUICE_API_KEY_SECRET_ARN"}
    config = synthesis.stacks[env].config
    for function in step_functions(synthesis, env).values():
        variables = function["Properties"]["Environment"]["Variables"]
        ours = {k for k in variables if k.startswith("SLUICE_")}
        assert ours <= read_by_settings, ours - read_by_settings
        assert ours >= required | CONFIGURED, (required | CONFIGURED) - ours
        assert variables["POWERTOOLS_SERVICE_NAME"] == "sluice"
        assert variables["POWERTOOLS_LOG_LEVEL"] == config.log_level
        assert variables["SLUICE_MAP_CONCURRENCY"] == str(config.map_concurrency)
        assert variables["SLUICE_API_KEY_SECRET_ARN"] == {
            "Ref": next(iter(synthesis.resources(env, "AWS::SecretsManager::Secret")))
        }


def test_function_log_groups_have_retention(synthesis: Synthesis, env: str) -> None:
    groups = synthesis.resources(env, "AWS::Logs::LogGroup")
    expected = synthesis.stacks[env].config.log_retention_days
    for function in step_functions(synthesis, env).values():
        logical_id = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert groups[logical_id]["Properties"]["RetentionInDays"] == expected
