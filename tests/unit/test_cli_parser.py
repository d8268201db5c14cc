"""The CLI's defaults are the contract's: a local run and an estimate start from what a step would use."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

import pytest
from sluice.contract import JOB_OPTIONS, LOCAL_SETTING_DEFAULTS, METADATA_PREFIX, SETTING_DEFAULTS, Settings
from sluice.plan import JobOptions

from local.cli import build_parser
from local.cloud import LocalSettings
from local.deployed.submit import options_metadata

SETTINGS = Settings(bucket="b", table="t", provider_base_url="http://p", api_key_secret_arn="a")


def test_run_defaults_are_a_local_runs_settings() -> None:
    args = build_parser().parse_args(["run", "in.jsonl"])
    chosen = {
        "concurrency": args.concurrency,
        "map_concurrency": args.map_concurrency,
        "shard_lines": args.shard_lines,
        "max_attempts": args.max_attempts,
        "request_timeout_s": args.request_timeout,
    }
    assert chosen == {name: LOCAL_SETTING_DEFAULTS[name] for name in chosen}


def test_estimate_defaults_are_the_steps_settings() -> None:
    args = build_parser().parse_args(["estimate", "in.jsonl"])
    assert (args.concurrency, args.shard_lines) == (SETTING_DEFAULTS["concurrency"], SETTING_DEFAULTS["shard_lines"])


def test_help_shows_the_default_it_uses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"shards running at once (default: {LOCAL_SETTING_DEFAULTS['map_concurrency']})" in text
    assert f"seconds per attempt (default: {LOCAL_SETTING_DEFAULTS['request_timeout_s']:g})" in text


def test_every_job_option_the_cli_takes_is_one_plan_reads() -> None:
    from local.cli.parser import _job_options

    p = argparse.ArgumentParser()
    _job_options(p)
    dests = {action.dest for action in p._actions if action.dest != "help"}
    assert {dest.replace("_", "-") for dest in dests} <= set(JOB_OPTIONS)
    given = {"mode": "auto", "budget": "5", "model": "m", "concurrency": "3", "map-concurrency": "2"}
    given |= {"max-attempts": "4", "on-batch-incomplete": "error", "deadline-hours": "30", "max-error-rate": "0.1"}
    args = build_parser().parse_args(
        ["submit", "in.jsonl", *(part for k, v in given.items() for part in (f"--{k}", v))]
    )
    metadata = options_metadata(args)
    assert len(metadata) == len(dests) == len(given)
    assert JobOptions.from_metadata(metadata, SETTINGS).budget_usd == 5.0


def test_the_readme_documents_every_job_option_and_no_other() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("### Options per job", 1)[1].split("\n### ", 1)[0]
    named = set(re.findall(rf"{METADATA_PREFIX}([a-z-]+)`", section))
    named |= set(re.findall(r"`-([a-z-]+)`", section))
    assert named == set(JOB_OPTIONS) - {"parent-job"}


def test_a_local_clouds_settings_default_to_the_contracts_local_defaults() -> None:
    named = {f.name: f.default for f in fields(LocalSettings) if f.name in LOCAL_SETTING_DEFAULTS}
    assert named == {name: LOCAL_SETTING_DEFAULTS[name] for name in named}
    assert {"map_concurrency", "poll_seconds", "shard_lines"} <= set(named)
