"""Every command with bad arguments, bad files and unreachable providers: the documented exit
code, one message that names what to fix, and never a traceback.

The table runs in this process (`local.cli.main`), which is what the `sluice` script calls;
a few cases run as a subprocess too, to see exactly what a terminal would.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from local.cli import build_parser, main
from local.console import EXIT_AWS, EXIT_INPUT, EXIT_INTERNAL, EXIT_NOT_FOUND, EXIT_PROVIDER, EXIT_USAGE
from local.sim_options import config_from
from local.simulator import SimConfig, SimulatorServer
from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    """A port nothing listens on: every connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A working directory with the files a careless user might hand `sluice`, and no AWS or
    provider settings from the machine running the tests."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "OPENAI_", "SLUICE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.chdir(tmp_path)
    good = write_jsonl(tmp_path / "good.jsonl", [request_line(f"g-{n}") for n in range(3)])
    results = tmp_path / "good.results.jsonl"
    results.write_bytes(
        b"".join(
            orjson.dumps({"id": f"b-{n}", "custom_id": f"g-{n}", "response": {"status_code": 200}, "error": None})
            + b"\n"
            for n in range(3)
        )
    )
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_bytes(b"\n\n  \n")
    (tmp_path / "random.bin").write_bytes(random.Random(4).randbytes(4096))
    (tmp_path / "data.csv").write_text("custom_id,prompt\na,hello\nb,world\n")
    (tmp_path / "notes.txt").write_text("a file where a directory belongs\n")
    (tmp_path / "adir").mkdir()
    yield {
        "good": str(good),
        "results": str(results),
        "empty": str(tmp_path / "empty.jsonl"),
        "blank": str(tmp_path / "blank.jsonl"),
        "random": str(tmp_path / "random.bin"),
        "csv": str(tmp_path / "data.csv"),
        "file": str(tmp_path / "notes.txt"),
        "dir": str(tmp_path / "adir"),
        "missing": str(tmp_path / "missing.jsonl"),
    }


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    code: int
    says: str
    env: tuple[tuple[str, str], ...] = ()


def case(*argv: str, code: int, says: str, **env: str) -> Case:
    return Case(argv, code, says, tuple(env.items()))


REFUSED = f"http://127.0.0.1:{closed_port()}/v1"

BAD_ARGUMENTS = [
    case("run", "{good}", "--concurrency", "0", code=EXIT_USAGE, says="argument --concurrency: 0 is not allowed"),
    case("run", "{good}", "--concurrency", "-5", code=EXIT_USAGE, says="argument --concurrency: -5 is not allowed"),
    case("run", "{good}", "--concurrency", "many", code=EXIT_USAGE, says="argument --concurrency: 'many' is not"),
    case("run", "{good}", "--map-concurrency", "0", code=EXIT_USAGE, says="argument --map-concurrency"),
    case("run", "{good}", "--shard-lines", "0", code=EXIT_USAGE, says="argument --shard-lines"),
    case("run", "{good}", "--max-attempts", "0", code=EXIT_USAGE, says="argument --max-attempts"),
    case("run", "{good}", "--request-timeout", "0", code=EXIT_USAGE, says="argument --request-timeout"),
    case("run", "{good}", "--request-timeout", "nan", code=EXIT_USAGE, says="not a finite number"),
    case("run", "{good}", "--latency", "-1", code=EXIT_USAGE, says="argument --latency: -1 is not allowed"),
    case("run", "{good}", "--mode", "sideways", code=EXIT_USAGE, says="argument --mode: invalid choice"),
    case("run", "{good}", "--out", "{file}", code=EXIT_USAGE, says="is a file, not a directory"),
    case("run", code=EXIT_USAGE, says="the following arguments are required: file"),
    case("run", "{good}", "--no-cache", "--cache-dir", "x", code=EXIT_USAGE, says="not allowed with argument"),
    case("estimate", "{good}", "--output-tokens", "-1", code=EXIT_USAGE, says="argument --output-tokens"),
    case("estimate", "{good}", "--concurrency", "0", code=EXIT_USAGE, says="argument --concurrency"),
    case("estimate", "{good}", "--latency", "0", code=EXIT_USAGE, says="argument --latency"),
    case("estimate", "{good}", "--shard-lines", "0", code=EXIT_USAGE, says="argument --shard-lines"),
    case("simulator", "--port", "70000", code=EXIT_USAGE, says="argument --port: 70000 is not a TCP port"),
    case("simulator", "--port", "-1", code=EXIT_USAGE, says="argument --port"),
    case("simulator", "--latency", "-1", code=EXIT_USAGE, says="argument --latency"),
    case("simulator", "--jitter", "-0.5", code=EXIT_USAGE, says="argument --jitter"),
    case("simulator", "--rate-429", "1.5", code=EXIT_USAGE, says="argument --rate-429: 1.5 is not a share"),
    case("simulator", "--rate-500", "-0.1", code=EXIT_USAGE, says="argument --rate-500"),
    case("simulator", "--rate-drop", "2", code=EXIT_USAGE, says="argument --rate-drop"),
    case("simulator", "--rate-slow", "2", code=EXIT_USAGE, says="argument --rate-slow"),
    case("simulator", "--slow", "-1", code=EXIT_USAGE, says="argument --slow"),
    case("simulator", "--retry-after", "-1", code=EXIT_USAGE, says="argument --retry-after"),
    case("simulator", "--rpm", "-1", code=EXIT_USAGE, says="argument --rpm"),
    case("simulator", "--tpm", "x", code=EXIT_USAGE, says="argument --tpm"),
    case("simulator", "--seed", "-1", code=EXIT_USAGE, says="argument --seed"),
    case("simulator", "--rate-429", "0.6", "--rate-500", "0.6", code=EXIT_USAGE, says="add up to more than 1"),
    case("submit", "{good}", "--concurrency", "0", code=EXIT_USAGE, says="argument --concurrency"),
    case("submit", "{good}", "--map-concurrency", "-2", code=EXIT_USAGE, says="argument --map-concurrency"),
    case("submit", "{good}", "--max-attempts", "0", code=EXIT_USAGE, says="argument --max-attempts"),
    case("submit", "{good}", "--deadline-hours", "0", code=EXIT_USAGE, says="argument --deadline-hours"),
    case("submit", "{good}", "--watch", "--interval", "0", code=EXIT_USAGE, says="argument --interval"),
    case("submit", "{good}", "--mode", "sideways", code=EXIT_USAGE, says="sluice-mode='sideways'"),
    case("status", "--limit", "0", code=EXIT_USAGE, says="argument --limit"),
    case("status", "job-1", "--watch", "--interval", "-1", code=EXIT_USAGE, says="argument --interval"),
    case("retry", "job-1", "--concurrency", "0", code=EXIT_USAGE, says="argument --concurrency"),
    case("retry", "job-1", "--max-attempts", "-1", code=EXIT_USAGE, says="argument --max-attempts"),
    case("retry", "job-1", "--deadline-hours", "-1", code=EXIT_USAGE, says="argument --deadline-hours"),
    case("retry", "job-1", "--interval", "0", code=EXIT_USAGE, says="argument --interval"),
    case("results", "job-1", "--out", "{file}", code=EXIT_USAGE, says="is a file, not a directory"),
    case("cancel", code=EXIT_USAGE, says="the following arguments are required: job"),
    case("frobnicate", code=EXIT_USAGE, says="invalid choice: 'frobnicate'"),
    case(code=EXIT_USAGE, says="the following arguments are required: COMMAND"),
    case("verify", "{results}", "{good}", "{empty}", code=EXIT_USAGE, says="the files look swapped"),
]

BAD_FILES = [
    case(command, "{" + name + "}", code=EXIT_INPUT, says=says)
    for command in ("run", "estimate", "submit")
    for name, says in (
        ("missing", "no such file"),
        ("dir", "not a file"),
        ("empty", "no requests in the file"),
        ("blank", "no requests in the file"),
        ("random", "invalid line(s)"),
        ("csv", "line 1, column 1: invalid JSON"),
    )
] + [
    case("verify", "{missing}", "{results}", "{empty}", code=EXIT_INPUT, says="no such file"),
    case("verify", "{good}", "{results}", "{empty}", "--summary", "{good}", code=EXIT_INPUT, says="not a job summary"),
    case("status", "job-1", "--item", "g-1", "--input", "{missing}", code=EXIT_AWS, says="no AWS region"),
    case("retry", "job-1", "--input", "{dir}", code=EXIT_AWS, says="no AWS region"),
]

PROVIDERS = [
    case("run", "{good}", code=EXIT_PROVIDER, says="is not reachable", OPENAI_BASE_URL=REFUSED),
    case("run", "{good}", code=EXIT_PROVIDER, says="is not reachable", OPENAI_BASE_URL=REFUSED, OPENAI_API_KEY="sk-x"),
    case("run", "{good}", code=EXIT_USAGE, says="is not an http(s) URL", OPENAI_BASE_URL="localhost:8000/v1"),
]

DEPLOYED_WITHOUT_AWS = [
    case("status", "reviews-0123456789ab", code=EXIT_AWS, says="a job id printed by `sluice run` is a local job"),
    case("results", "reviews-0123456789ab", code=EXIT_AWS, says="no AWS region"),
    case("cancel", "reviews-0123456789ab", code=EXIT_AWS, says="no AWS region"),
]

TABLE = BAD_ARGUMENTS + BAD_FILES + PROVIDERS + DEPLOYED_WITHOUT_AWS


def sluice_in_process(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors and --help
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("row", TABLE, ids=lambda c: " ".join(c.argv) + "".join(f" {k}" for k, _ in c.env) or "-")
def test_every_command_fails_with_its_exit_code_and_one_clear_message(
    row: Case, files: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in row.env:
        monkeypatch.setenv(name, value)
    code, out, err = sluice_in_process([arg.format(**files) for arg in row.argv], capsys)

    assert code == row.code, err
    assert row.says in err, err
    assert "Traceback" not in out + err
    # the message is about the user's flags and files, never the settings the CLI passes on
    assert "SLUICE_" not in err
    assert out == "", out


def test_a_bug_is_one_line_and_exit_70_and_the_traceback_only_on_request(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import local.inputs

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(local.inputs, "check_file", broken)
    code, _, err = sluice_in_process(["estimate", files["good"]], capsys)
    assert code == EXIT_INTERNAL == 70
    assert "internal error: RuntimeError: a bug" in err and "SLUICE_DEBUG=1" in err
    assert "Traceback" not in err

    monkeypatch.setenv("SLUICE_DEBUG", "1")
    code, _, err = sluice_in_process(["estimate", files["good"]], capsys)
    assert code == EXIT_INTERNAL and "Traceback" in err


def test_a_local_job_id_given_to_status_points_at_its_outputs(
    files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = Path("out")
    out.mkdir()
    (out / "reviews.summary.json").write_bytes(orjson.dumps({"job_id": "reviews-0123456789ab", "counts": {}}))
    (out / "reviews.results.jsonl").write_bytes(b"")

    for command in ("status", "results", "cancel", "retry"):
        code, _, err = sluice_in_process([command, "reviews-0123456789ab"], capsys)
        assert code == EXIT_NOT_FOUND, err
        assert "reviews-0123456789ab is a local job (from `sluice run`)" in err
        assert "out/reviews.results.jsonl" in err and "out/reviews.summary.json" in err
        assert "AWS" not in err


def test_version_and_the_simulators_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = sluice_in_process(["--version"], capsys)
    assert code == 0 and out.startswith("sluice ")

    code, out, _ = sluice_in_process(["simulator", "--help"], capsys)
    assert code == 0
    for option in ("--rate-429", "--rate-500", "--rate-drop", "--rate-slow", "--jitter", "--rpm", "--tpm", "--seed"):
        assert option in out
    # the options' defaults are the simulator's own
    defaults = build_parser().parse_args(["simulator"])
    assert config_from(defaults) == SimConfig()
    chosen = build_parser().parse_args(["simulator", "--rate-429", "0.1", "--jitter", "0.2", "--rpm", "60"])
    assert config_from(chosen) == SimConfig(rate_429=0.1, jitter_s=0.2, rpm_limit=60)


def test_verify_with_the_files_in_the_wrong_order_says_so(
    files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = sluice_in_process(["verify", files["results"], files["good"], files["empty"]], capsys)
    assert code == EXIT_USAGE
    assert f"INPUT {files['results']} looks like a results file" in err
    assert f"RESULTS {files['good']} looks like an input file" in err
    assert "sluice verify INPUT RESULTS ERRORS" in err and out == ""

    code, out, _ = sluice_in_process(["verify", files["good"], files["results"], files["empty"]], capsys)
    assert code == 0 and out.startswith("OK: 3 input lines"), out


def test_a_provider_that_refuses_the_key_is_caught_before_sending(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with SimulatorServer(SimConfig(latency_s=0, api_key="sk-right")) as sim:
        monkeypatch.setenv("OPENAI_BASE_URL", sim.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
        code, _, err = sluice_in_process(["run", files["good"], "--quiet"], capsys)
        sent = [e for e in sim.log if e["method"] == "POST"]
    assert code == EXIT_PROVIDER, err
    assert f"provider {sim.base_url} refused OPENAI_API_KEY: HTTP 401" in err and "nothing was sent" in err
    assert sent == []


def sluice(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "local.cli", *args],
        cwd=ROOT,
        env={**env, "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_as_a_terminal_sees_them(files: dict[str, str]) -> None:
    env = dict(os.environ)
    for argv, code, says in (
        (["run", files["random"]], EXIT_INPUT, "invalid line(s)"),
        (["run", files["good"], "--concurrency", "0"], EXIT_USAGE, "argument --concurrency: 0 is not allowed"),
        (["run", files["good"], "--quiet"], EXIT_PROVIDER, f"provider {REFUSED} is not reachable"),
    ):
        done = sluice(*argv, env={**env, "OPENAI_BASE_URL": REFUSED})
        assert done.returncode == code, done.stderr
        assert says in done.stderr
        assert "Traceback" not in done.stdout + done.stderr
    version = sluice("--version", env=env)
    assert version.returncode == 0 and version.stdout.startswith("sluice ")
