"""The CLI's defaults are the contract's: a local run and an estimate start from what a step would use."""

from __future__ import annotations

import argparse
import io
import re
from contextlib import redirect_stdout
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from sluice.contract import (
    DEFAULT_PROVIDER,
    JOB_OPTIONS,
    LOCAL_SETTING_DEFAULTS,
    MAX_BUDGET_USD,
    MAX_REQUEST_TIMEOUT_S,
    METADATA_PREFIX,
    PROVIDERS,
    SETTING_DEFAULTS,
    STEPS,
    VALIDATION_CHECKS,
    Settings,
    job_option_key,
)
from sluice.plan.plan import JobOptions, PlanError

from sluice_local.cli import build_parser
from sluice_local.cloud import LocalSettings
from sluice_local.console import EXIT_USAGE, CliError
from sluice_local.deployed.submit import options_metadata

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
    assert f"(a shard Lambda's time less its margin) (default: {LOCAL_SETTING_DEFAULTS['request_timeout_s']:g})" in text


def test_every_job_option_the_cli_takes_is_one_plan_reads() -> None:
    from sluice_local.cli.parser_options import job_options

    p = argparse.ArgumentParser()
    job_options(p)
    dests = {action.dest for action in p._actions if action.dest != "help"}
    assert {dest.replace("_", "-") for dest in dests} <= set(JOB_OPTIONS)
    given = {"mode": "auto", "budget": "5", "model": "m", "concurrency": "3", "map-concurrency": "2"}
    given |= {"max-attempts": "4", "on-batch-incomplete": "error", "deadline-hours": "30", "max-error-rate": "0.1"}
    given |= {"provider": "openai"}
    # a deadline picks each shard's mode and replaces --deadline-hours: Plan takes it apart from those
    deadline = {"deadline": "12h", "batch-turnaround": "2h", "rpm": "500", "tpm": "90000", "flex-models": "gpt-9"}
    deadline |= {"batch-cancel": "15m"}
    named: set[str] = set()
    for options in (given, deadline):
        args = build_parser().parse_args(
            ["submit", "in.jsonl", *(part for k, v in options.items() for part in (f"--{k}", v))]
        )
        metadata = options_metadata(args)
        assert len(metadata) == len(options)
        named |= set(metadata)
    assert len(named) == len(dests) == len(given) + len(deadline)
    assert (
        JobOptions.from_metadata(
            options_metadata(build_parser().parse_args(["submit", "x", "--budget", "5"])), SETTINGS
        ).budget_usd
        == 5.0
    )


def test_the_cli_docs_document_every_job_option_and_no_other() -> None:
    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    section = text.split("## Job options", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(rf"`{METADATA_PREFIX}([a-z-]+)`", section))
    named |= set(re.findall(r"`-([a-z]+)`", section))
    assert named == set(JOB_OPTIONS) - {"parent-job"}


def test_a_local_clouds_settings_default_to_the_contracts_local_defaults() -> None:
    named = {f.name: f.default for f in fields(LocalSettings) if f.name in LOCAL_SETTING_DEFAULTS}
    assert named == {name: LOCAL_SETTING_DEFAULTS[name] for name in named}
    assert {"map_concurrency", "poll_seconds", "shard_lines"} <= set(named)


@pytest.mark.parametrize("command", ["run", "estimate", "submit"])
def test_provider_choices_are_the_contracts_families(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    for name in PROVIDERS:
        assert build_parser().parse_args([command, "in.jsonl", "--provider", name]).provider == name
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args([command, "in.jsonl", "--provider", "mistral"])
    assert refused.value.code == 2
    assert f"invalid choice: 'mistral' (choose from {', '.join(map(repr, PROVIDERS))})" in capsys.readouterr().err


def test_a_local_run_and_an_estimate_default_to_openai_and_a_submit_to_its_environment() -> None:
    assert build_parser().parse_args(["run", "in.jsonl"]).provider == DEFAULT_PROVIDER == "openai"
    assert build_parser().parse_args(["estimate", "in.jsonl"]).provider == DEFAULT_PROVIDER
    submitted = build_parser().parse_args(["submit", "in.jsonl"])
    assert submitted.provider is None and job_option_key("provider") not in options_metadata(submitted)


def test_submit_refuses_a_mode_the_named_provider_has_no_api_for() -> None:
    args = build_parser().parse_args(["submit", "in.jsonl", "--provider", "anthropic", "--mode", "background"])
    with pytest.raises(CliError) as refused:
        options_metadata(args)
    assert refused.value.code == EXIT_USAGE
    assert str(refused.value).startswith("sluice-mode=background: the anthropic provider has no background responses")
    args = build_parser().parse_args(["submit", "in.jsonl", "--provider", "anthropic"])
    assert options_metadata(args) == {"sluice-provider": "anthropic"}


def test_submit_validate_sets_the_jobs_validation_metadata(tmp_path: Path) -> None:
    schema = tmp_path / "review.json"
    schema.write_text('{"type": "object"}')
    args = build_parser().parse_args(
        ["submit", "in.jsonl", "--validate", "--validate-attempts", "4", "--repair", "--validate-schema", str(schema)]
    )
    metadata = options_metadata(args)
    assert metadata == {
        "sluice-validate": "all",
        "sluice-validate-repair": "yes",
        "sluice-validate-attempts": "4",
        "sluice-validate-schema": "inbox/schemas/review.json",
    }
    options = JobOptions.from_metadata(metadata, SETTINGS)
    assert (options.validate, options.validate_attempts, options.validate_repair) == (VALIDATION_CHECKS, 4, True)
    some = build_parser().parse_args(["submit", "in.jsonl", "--validate", "json,schema"])
    assert options_metadata(some) == {"sluice-validate": "json,schema", "sluice-validate-repair": "no"}


def test_run_help_says_which_modes_each_provider_has() -> None:
    """Issue 42: the README's table of families, in `sluice run --help`, from the code's own modes."""
    with pytest.raises(SystemExit), redirect_stdout(io.StringIO()) as out:
        build_parser().parse_args(["run", "--help"])
    text = " ".join(out.getvalue().split())
    assert (
        "modes by --provider: openai: direct, background, batch, auto; anthropic: direct, batch, auto; "
        "bedrock: direct, batch, auto" in text
    )


def test_a_request_timeout_that_leaves_a_shard_no_time_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A shard stops once less than the timeout plus its margin is left: at 880 s it never starts."""
    assert MAX_REQUEST_TIMEOUT_S == STEPS["run_shard"].timeout_s - SETTING_DEFAULTS["safety_margin_s"] == 880
    assert build_parser().parse_args(["run", "in.jsonl", "--request-timeout", "879"]).request_timeout == 879
    for too_long in ("880", "3600"):
        with pytest.raises(SystemExit) as refused:
            build_parser().parse_args(["run", "in.jsonl", "--request-timeout", too_long])
        assert refused.value.code == 2
        assert "give under 880 s (a shard Lambda's 900 s less its safety margin)" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "submit", "retry"])
def test_a_budget_past_what_the_job_row_counts_is_refused(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert build_parser().parse_args([command, "x", "--budget", "1e9"]).budget_usd == MAX_BUDGET_USD
    for huge in ("1e30", "1e308"):
        with pytest.raises(SystemExit) as refused:
            build_parser().parse_args([command, "x", "--budget", huge])
        assert refused.value.code == 2
        assert f"{huge!r} is more than the largest budget Sluice counts, $1,000,000,000" in capsys.readouterr().err
    with pytest.raises(PlanError, match="largest budget"):
        JobOptions.from_metadata({"sluice-budget-usd": "1e30"}, SETTINGS)


def _job_flags(command: str) -> dict[str, tuple[str | None, tuple[str, ...] | None]]:
    """The job options `command` takes: each flag's metavar and choices, as its help shows them."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        flag: (action.metavar, tuple(action.choices) if action.choices else None)
        for action in sub.choices[command]._actions
        for flag in action.option_strings
        if flag.removeprefix("--").replace("budget", "budget-usd") in JOB_OPTIONS
    }


def test_run_submit_and_retry_take_the_same_job_options_under_the_same_names() -> None:
    run = _job_flags("run")
    assert run == _job_flags("submit")
    # a retry carries its parent's validation
    assert {f: v for f, v in run.items() if not f.startswith("--validate")} == _job_flags("retry")
    assert {"--deadline", "--deadline-hours", "--rpm", "--tpm", "--on-batch-incomplete", "--budget"} <= set(run)
    deadline = {"--deadline", "--batch-turnaround", "--rpm", "--tpm", "--model", "--provider"}
    assert {f: run[f] for f in deadline} == {f: v for f, v in _job_flags("estimate").items() if f in deadline}


def test_the_readmes_submit_with_a_deadline_and_a_rate_is_taken_as_written() -> None:
    """`--deadline 12h` was taken for --deadline-hours ("'12h' is not a number"), and `--rpm` refused."""
    args = build_parser().parse_args(["submit", "big.jsonl", "--env", "dev", "--deadline", "12h", "--rpm", "30000"])
    assert options_metadata(args) == {"sluice-deadline": "12h", "sluice-rpm": "30000"}
    run = build_parser().parse_args(["run", "big.jsonl", "--deadline", "12h", "--rpm", "500", "--tpm", "90000"])
    assert (run.deadline, run.rpm, run.tpm) == ("12h", 500, 90000)


@pytest.mark.parametrize("abbreviated", [["--deadline-h", "3"], ["--budg", "5"], ["--conc", "3"]])
def test_a_flag_is_never_taken_from_its_first_letters(
    abbreviated: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["run", "in.jsonl", *abbreviated])
    assert refused.value.code == 2
    assert f"unrecognized arguments: {' '.join(abbreviated)}" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "submit"])
@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"type": "object", "properties": {', "not JSON (unexpected end of data"),
        ('{"type": "nonsense"}', "not a JSON schema answers can be checked against: Unknown type"),
        ("[1, 2]", "not a JSON schema answers can be checked against: a schema is a JSON object"),
    ],
)
def test_a_schema_file_that_is_no_schema_is_refused_with_the_arguments(
    command: str, content: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused by Plan, it started the local cloud, then ended FAILED with 0 results, 0 errors."""
    schema = tmp_path / "review.json"
    schema.write_text(content)
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args([command, "in.jsonl", "--validate", "--validate-schema", str(schema)])
    assert refused.value.code == 2
    assert f"argument --validate-schema: {schema}: {says}" in capsys.readouterr().err


def test_repair_without_validate_is_refused_not_dropped() -> None:
    from sluice_local.cli.validate_options import check_repair

    args = build_parser().parse_args(["submit", "in.jsonl", "--repair"])
    with pytest.raises(CliError, match=r"--repair adds what was wrong to a resend of --validate") as refused:
        options_metadata(args)
    assert refused.value.code == EXIT_USAGE
    with pytest.raises(CliError):
        check_repair(build_parser().parse_args(["run", "in.jsonl", "--repair"]))
    check_repair(build_parser().parse_args(["run", "in.jsonl", "--validate", "json", "--repair"]))


def test_an_output_the_disk_has_no_room_for_is_named_and_never_left_cut_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import io

    import sluice_local.console as console

    class FullDisk(io.BytesIO):
        """A file on a device with 10 bytes left."""

        def write(self, data: Any) -> int:
            if self.tell() + len(data) > 10:
                super().write(bytes(data)[: 10 - self.tell()])
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    real_open = open

    def full_disk_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            real_open(path, mode, *args, **kwargs).close()
            return FullDisk()
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(console, "open", full_disk_open, raising=False)
    target = tmp_path / "reviews.results.jsonl"
    with pytest.raises(console.CliError) as refused:
        console.write_output(target, b'{"custom_id": "r-1"}\n' * 100)
    assert refused.value.code == console.EXIT_OUTPUT == 73
    assert str(refused.value) == f"could not write {target}: No space left on device; nothing of it was left in place"
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    assert console.write_output(target, b"whole\n").read_bytes() == b"whole\n"
    assert [p.name for p in tmp_path.iterdir()] == ["reviews.results.jsonl"]
