"""The CLI's defaults are the contract's: a local run and an estimate start from what a step would use."""

from __future__ import annotations

import pytest
from sluice.contract import LOCAL_SETTING_DEFAULTS, SETTING_DEFAULTS

from local.cli import build_parser


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
