"""`sluice run` as a new user meets it: the input checked before work, the provider chosen from
OPENAI_BASE_URL alone, outputs that name the local files, and a README whose commands run as
written. (Signals: test_run_interrupt.py.)
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from sluice_local.cli import main
from sluice_local.console import EXIT_COMPLETED_WITH_ERRORS, EXIT_INPUT
from sluice_local.inputs import check_file
from sluice_local.simulator import SimConfig, SimulatorServer
from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def test_run_refuses_invalid_lines_unless_allowed_and_names_the_local_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = [request_line(f"r-{n}") for n in range(6)]
    lines[2] = b'{"custom_id": "r-2", "method": "POST",\n'
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)
    out = tmp_path / "out"

    assert main(["run", str(path), "--out", str(out), "--quiet"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert "1 invalid line(s) of 6" in err and "line 3, column 39: not JSON" in err
    assert "--allow-invalid" in err
    # a run refused for its input leaves nothing behind, not even the --out it would have made
    assert not out.exists()

    code = main(["run", str(path), "--out", str(out), "--quiet", "--allow-invalid", "--latency", "0.01"])
    captured = capsys.readouterr()
    # the invalid line is in errors, and the default --max-error-rate (0) says so in the exit code
    assert code == EXIT_COMPLETED_WITH_ERRORS, captured.err
    assert "5 results, 1 errors" in captured.err
    summary = orjson.loads((out / "mixed.summary.json").read_bytes())
    # the local bucket is gone once `run` exits: the summary and report name the files it wrote
    assert summary["input"] == str(path)
    assert summary["outputs"]["results"] == str(out / "mixed.results.jsonl")
    assert summary["outputs"]["errors"] == str(out / "mixed.errors.jsonl")
    assert all(Path(p).is_file() for p in summary["outputs"].values())
    assert "s3://" not in (out / "mixed.summary.json").read_text()
    assert "s3://" not in (out / "mixed.report.html").read_text()


def test_a_base_url_without_a_key_is_a_provider_that_needs_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl(tmp_path / "vllm.jsonl", [request_line(f"v-{n}") for n in range(5)])
    with SimulatorServer(SimConfig(latency_s=0.01)) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        code = main(["run", str(path), "--out", str(tmp_path / "out")])
        sent = {e["custom_id"] for e in server.log if e["path"] == "/v1/chat/completions" and e["status"] == 200}
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"provider: {server.base_url} (OPENAI_API_KEY is not set" in err
    assert "built-in SIMULATOR" not in err
    assert sent == {f"v-{n}" for n in range(5)}


def test_a_key_without_a_base_url_says_it_uses_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-looking")
    path = write_jsonl(tmp_path / "k.jsonl", [request_line("k-1")])
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--latency", "0"]) == 0
    err = capsys.readouterr().err
    assert "OPENAI_API_KEY is set but OPENAI_BASE_URL is not" in err and "built-in SIMULATOR" in err


def _readme_commands() -> list[list[str]]:
    """The README's shell lines that call sluice or python locally, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if ".venv/bin/" in line:
                # `JOB=$(.venv/bin/sluice submit …)`: the command inside the substitution
                command = line[line.index(".venv/bin/") :].removesuffix(")")
                commands.append(shlex.split(command))
    return commands


def test_every_file_the_readme_names_exists_or_an_earlier_command_makes_it(tmp_path: Path) -> None:
    made: set[str] = set()
    checked = 0
    for words in _readme_commands():
        program, *args = words
        if program.endswith("/python"):
            script = ROOT / args[0]
            assert script.is_file(), args[0]
            target = args[args.index("--out") + 1]
            made.add(target)
            # the script makes what the README says it makes
            subprocess.run([sys.executable, str(script), *args[1:3], "--out", str(tmp_path / target)], check=True)
            assert check_file(tmp_path / target, quiet=True).requests == int(args[args.index("--lines") + 1])
            continue
        command = args[0]
        for arg in args[1:]:
            if arg.endswith(".jsonl") and not arg.startswith(("out/", "s3://")) and command in ("run", "estimate"):
                assert (ROOT / arg).is_file() or arg in made, f"README: `{' '.join(words)}` names {arg}"
                checked += 1
            elif arg.endswith(".jsonl") and command in ("verify", "submit"):
                assert (ROOT / arg).is_file() or arg.startswith("out/"), f"README: `{' '.join(words)}` names {arg}"
                checked += 1
    assert checked >= 6
