"""Output validation's settings (issue 33): `--validate` on `sluice run`, `sluice-validate` and its
attempts and repair per job, and `SLUICE_VALIDATE` per environment."""

from __future__ import annotations

import pytest
from sluice.contract import VALIDATION_CHECKS, Settings, SettingsError
from sluice.plan.plan import JobOptions, PlanError

from sluice_local.cli.parser import build_parser
from sluice_local.cli.run import _job_metadata

SETTINGS = Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="arn")


def run_args(*flags: str) -> dict[str, str]:
    return _job_metadata(build_parser().parse_args(["run", "in.jsonl", *flags]))


def test_validate_alone_turns_on_every_check_with_three_sends_and_no_repair() -> None:
    options = JobOptions.from_metadata(run_args("--validate"), SETTINGS)
    assert (options.validate, options.validate_attempts, options.validate_repair) == (VALIDATION_CHECKS, 3, False)


def test_a_job_names_its_checks_attempts_and_repair() -> None:
    metadata = run_args("--validate", "schema,json", "--validate-attempts", "1", "--repair")
    assert metadata["sluice-validate"] == "schema,json"
    options = JobOptions.from_metadata(metadata, SETTINGS)
    assert (options.validate, options.validate_attempts, options.validate_repair) == (("json", "schema"), 1, True)


def test_a_job_that_does_not_ask_validates_nothing() -> None:
    assert "sluice-validate" not in run_args()
    assert JobOptions.from_metadata({}, SETTINGS).validate == ()


def test_the_environment_sets_what_a_job_does_not() -> None:
    env = {
        **SETTINGS.to_env(),
        "SLUICE_VALIDATE": "all",
        "SLUICE_VALIDATE_ATTEMPTS": "5",
        "SLUICE_VALIDATE_REPAIR": "on",
    }
    settings = Settings.from_env(env)
    options = JobOptions.from_metadata({}, settings)
    assert (options.validate, options.validate_attempts, options.validate_repair) == (VALIDATION_CHECKS, 5, True)
    assert JobOptions.from_metadata({"sluice-validate": "none"}, settings).validate == ()


def test_an_unknown_check_is_refused_where_it_is_given() -> None:
    with pytest.raises(PlanError, match="sluice-validate='jsn'"):
        JobOptions.from_metadata({"sluice-validate": "jsn"}, SETTINGS)
    with pytest.raises(SettingsError, match="SLUICE_VALIDATE"):
        Settings.from_env({**SETTINGS.to_env(), "SLUICE_VALIDATE": "jsn"})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "in.jsonl", "--validate", "jsn"])
