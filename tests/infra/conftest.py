"""Synthesizes every environment once per session; the infra tests only read the result."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# jsii prints a banner on every start under Node 20 (end of life); it is noise in test output.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk
from aws_cdk import assertions

from infra.checks import SecurityChecks
from infra.config import cdk_json_context
from infra.stack import SluiceStack, build_app
from sluice_local.iam import FAMILY_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
CONTEXT: dict[str, Any] = cdk_json_context()
ENVIRONMENTS = list(CONTEXT["environments"])
BEDROCK_ENV = "dev"


@dataclass(frozen=True)
class Synthesis:
    stacks: dict[str, SluiceStack]
    templates: dict[str, assertions.Template]
    raw: dict[str, dict[str, Any]]
    # cdk-nag runs as a CDK policy-validation plugin: synth fails if any finding is left
    # unacknowledged, and the report says which.
    validation_error: str | None
    validation_report: dict[str, Any]

    def resources(self, env: str, type_: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.raw[env]["Resources"].items() if v["Type"] == type_}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under `pytest -n N --dist loadgroup` (`make test`) the tests that read the synthesized app
    # share one worker, so the app is synthesized once instead of once per worker; synthesis takes
    # a minute of CPU, so `make check` leaves them to `make test`.
    for item in items:
        if {"synthesis", "bedrock_synthesis"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group("cdk-synth"))
            item.add_marker(pytest.mark.synth)
        elif _builds_an_app(getattr(item, "module", None)):
            item.add_marker(pytest.mark.synth)


def _builds_an_app(module: object) -> bool:
    """Whether a test module imports the CDK (each app it builds starts jsii's node process)."""
    names = vars(module).values() if module is not None else ()
    return any(
        str(getattr(value, "__module__", None) or getattr(value, "__name__", "")).startswith("aws_cdk")
        for value in names
    )


def bedrock_context(env: str = BEDROCK_ENV) -> dict[str, Any]:
    """cdk.json's context with the environment `env` sending to Bedrock, as a user would switch it."""
    chosen = {k: v for k, v in CONTEXT["environments"][env].items() if k not in FAMILY_SETTINGS}
    return {**CONTEXT, "environments": {env: {**chosen, "provider": "bedrock"}}}


@pytest.fixture(scope="session")
def synthesis(tmp_path_factory: pytest.TempPathFactory) -> Synthesis:
    return synthesized(tmp_path_factory, CONTEXT)


@pytest.fixture(scope="session")
def bedrock_synthesis(tmp_path_factory: pytest.TempPathFactory) -> Synthesis:
    """The dev environment with `"provider": "bedrock"` (its template under `BEDROCK_ENV`)."""
    return synthesized(tmp_path_factory, bedrock_context())


def synthesized(tmp_path_factory: pytest.TempPathFactory, context: dict[str, Any]) -> Synthesis:
    outdir = tmp_path_factory.mktemp("cdk.out")
    app = cdk.App(context={**context, "aws:cdk:bundling-stacks": []}, outdir=str(outdir))
    stacks = build_app(app)
    cdk.Validations.of(app).add_plugins(SecurityChecks(app))
    try:
        app.synth()
        error = None
    except Exception as exc:  # jsii surfaces the CDK ValidationError as a plain exception
        error = str(exc)
    raw = {
        name: json.loads((outdir / f"{stack.stack_name}.template.json").read_text()) for name, stack in stacks.items()
    }
    report_file = outdir / "validation-report.json"
    return Synthesis(
        stacks=stacks,
        templates={
            name: assertions.Template.from_json(t, skip_cyclical_dependencies_check=True) for name, t in raw.items()
        },
        raw=raw,
        validation_error=error,
        validation_report=json.loads(report_file.read_text()) if report_file.exists() else {},
    )


@pytest.fixture(params=ENVIRONMENTS)
def env(request: pytest.FixtureRequest) -> str:
    return request.param
