"""`sluice run` sends the job to the provider named by OPENAI_BASE_URL / OPENAI_API_KEY."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from sluice_local.simulator import SimConfig, SimulatorServer
from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_run_uses_the_configured_provider_and_its_key(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "mine.jsonl", [request_line(f"p-{n}") for n in range(25)])
    with SimulatorServer(SimConfig(latency_s=0.01, api_key="sk-users-own-key")) as provider:
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}",
            "OPENAI_BASE_URL": provider.base_url,
            "OPENAI_API_KEY": "sk-users-own-key",
        }
        command = [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--out", str(tmp_path / "out")]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=120)
        sent = {e["custom_id"] for e in provider.log if e["path"] == "/v1/chat/completions" and e["status"] == 200}

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert f"provider: {provider.base_url}".encode() in done.stderr
    assert b"SIMULATOR" not in done.stderr and b"warning" not in done.stderr
    assert sent == {f"p-{n}" for n in range(25)}
    results = (tmp_path / "out" / "mine.results.jsonl").read_bytes().splitlines()
    assert [orjson.loads(r)["custom_id"] for r in results] == [f"p-{n}" for n in range(25)]


def test_a_base_url_without_its_version_is_refused_as_the_real_provider_would(tmp_path: Path) -> None:
    """The openai SDK reads OPENAI_BASE_URL with its /v1: without it every request reaches a path
    the provider does not serve. The simulator answers 404 there as OpenAI does, so the mistake
    shows up on it, before a real key is used."""
    path = write_jsonl(tmp_path / "mine.jsonl", [request_line(f"p-{n}") for n in range(25)])
    with SimulatorServer(SimConfig(latency_s=0.01)) as provider:
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}", "OPENAI_BASE_URL": provider.url}
        command = [
            sys.executable,
            "-m",
            "sluice_local.cli",
            "run",
            str(path),
            "--no-cache",
            "--out",
            str(tmp_path / "out"),
        ]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=120)
        log = list(provider.log)

    assert done.returncode == 8, done.stderr.decode()[-2000:]
    assert b"answered HTTP 404 to GET /models" in done.stderr
    # not one request reached the API's own paths
    assert not any(e["path"].startswith("/v1/") for e in log)
    errors = (tmp_path / "out" / "mine.errors.jsonl").read_bytes().splitlines()
    # the first answers are errors as they came; the rest were refused once they showed the 404
    assert len(errors) == 25 and {orjson.loads(e)["error"]["code"] for e in errors} <= {
        "provider_error",
        "provider_refused",
    }


def test_run_on_anthropic_sends_to_anthropic_base_url_with_its_key_and_never_shows_it(tmp_path: Path) -> None:
    lines = [request_line(f"a-{n}").replace(b"gpt-4o-mini", b"claude-3-5-haiku-latest") for n in range(12)]
    path = write_jsonl(tmp_path / "claude.jsonl", lines)
    key = "sk-ant-users-own-key"
    with SimulatorServer(SimConfig(latency_s=0.01, api_key=key)) as provider:
        # as Anthropic's SDK reads it: the base URL stops before /v1
        base_url = provider.base_url.removesuffix("/v1")
        env = {
            **os.environ,
            "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}",
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": key,
            "OPENAI_API_KEY": "sk-not-for-anthropic",
        }
        env.pop("OPENAI_BASE_URL", None)
        command = [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--provider", "anthropic", "--no-cache"]
        done = subprocess.run([*command, "--out", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True)
        log = list(provider.log)

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert f"provider: {base_url}".encode() in done.stderr and key.encode() not in done.stderr + done.stdout
    assert [e["path"] for e in log] == ["/v1/models"] + ["/v1/messages"] * 12
    assert {e["status"] for e in log} == {200}
    results = (tmp_path / "out" / "claude.results.jsonl").read_bytes().splitlines()
    bodies = [orjson.loads(r)["response"]["body"] for r in results]
    assert {b["object"] for b in bodies} == {"chat.completion"} and {b["model"] for b in bodies} == {
        "claude-3-5-haiku-latest"
    }
    summary = orjson.loads((tmp_path / "out" / "claude.summary.json").read_bytes())
    assert summary["run"]["provider"] == f"anthropic: {base_url}"
    assert key not in (tmp_path / "out" / "claude.report.html").read_text()


def test_run_on_anthropic_without_its_variables_uses_the_simulator_and_refuses_background(tmp_path: Path) -> None:
    lines = [request_line(f"s-{n}").replace(b"gpt-4o-mini", b"claude-3-5-haiku-latest") for n in range(8)]
    path = write_jsonl(tmp_path / "small.jsonl", lines)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = f"{ROOT / 'functions'}:{ROOT}"
    command = [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--provider", "anthropic", "--no-cache"]
    done = subprocess.run([*command, "--out", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True)

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"provider: built-in SIMULATOR" in done.stderr
    summary = orjson.loads((tmp_path / "out" / "small.summary.json").read_bytes())
    assert summary["status"] == "SUCCEEDED" and summary["counts"]["results"] == 8
    assert summary["run"]["provider"].startswith("anthropic: built-in simulator")
    # priced at Claude's list price, not unknown
    costs = summary["cost_estimate_usd"]
    assert costs["provider"] > 0 and costs["provider_all_batch"] == pytest.approx(
        costs["provider_all_direct"] / 2, rel=0.01
    )

    refused = subprocess.run(
        [*command, "--mode", "background", "--out", str(tmp_path / "refused")], cwd=ROOT, env=env, capture_output=True
    )
    assert refused.returncode == 2
    assert refused.stderr.decode().strip().splitlines() == [
        "sluice: --mode background: the anthropic provider has no background responses Sluice can run; "
        "use one of direct, batch, auto"
    ]
    assert not (tmp_path / "refused").exists()


def test_a_job_plan_refuses_for_its_options_exits_2_with_plans_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sluice_local.cli import main

    # what `run` refuses first, let through: Plan's own refusal is the backstop
    monkeypatch.setattr("sluice_local.cli.run.check_mode", lambda *_: None)
    for name in [n for n in os.environ if n.startswith(("OPENAI_", "ANTHROPIC_"))]:
        monkeypatch.delenv(name)
    lines = [request_line(f"p-{n}").replace(b"gpt-4o-mini", b"claude-3-5-haiku-latest") for n in range(3)]
    path = write_jsonl(tmp_path / "refused.jsonl", lines)
    argv = ["run", str(path), "--provider", "anthropic", "--mode", "background", "--no-cache", "--quiet"]

    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "FAILED" in err and "sluice-mode=background: the anthropic provider has no background responses" in err
