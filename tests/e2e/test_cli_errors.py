"""Every command with bad arguments, bad files and unreachable providers: the documented exit
code, one message that names what to fix, and never a traceback.

The table runs in this process (`sluice_local.cli.main`), which is what the `sluice` script calls;
a few cases run as a subprocess too, to see exactly what a terminal would.
"""

from __future__ import annotations

import gzip
import os
import random
import re
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from sluice_local.cli import build_parser, main
from sluice_local.console import EXIT_AWS, EXIT_INPUT, EXIT_INTERNAL, EXIT_NOT_FOUND, EXIT_PROVIDER, EXIT_USAGE
from sluice_local.providers import check_provider
from sluice_local.sim_options import config_from
from sluice_local.simulator import SimConfig, SimulatorServer
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
        if name.startswith(("AWS_", "OPENAI_", "ANTHROPIC_", "SLUICE_")):
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
    (tmp_path / "good.jsonl.gz").write_bytes(gzip.compress(good.read_bytes()))
    with zipfile.ZipFile(tmp_path / "good.zip", "w") as archive:
        archive.writestr("good.jsonl", good.read_bytes())
    unpriced = orjson.loads(request_line("u-1"))
    unpriced["body"]["model"] = "llama-3-8b"
    nameless = orjson.loads(request_line("n-1"))
    del nameless["body"]["model"]
    write_jsonl(tmp_path / "llama.jsonl", [orjson.dumps(unpriced) + b"\n", orjson.dumps(nameless) + b"\n"])
    huge = orjson.loads(request_line("h-1"))
    huge["body"]["messages"][0]["content"] = "y" * 20_000_000
    write_jsonl(tmp_path / "huge.jsonl", [request_line("h-0"), orjson.dumps(huge) + b"\n"])
    write_jsonl(tmp_path / "cut.jsonl", [request_line("c-0"), request_line("c-1").replace(b"}}", b"}", 1)])
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
        "gz": str(tmp_path / "good.jsonl.gz"),
        "zip": str(tmp_path / "good.zip"),
        "llama": str(tmp_path / "llama.jsonl"),
        "huge": str(tmp_path / "huge.jsonl"),
        "cut": str(tmp_path / "cut.jsonl"),
        "new_out": str(tmp_path / "new-out"),
        "under_file": str(tmp_path / "notes.txt" / "out"),
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
    case("run", "{good}", "--repair", code=EXIT_USAGE, says="--repair adds what was wrong to a resend of --validate"),
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
    case("submit", "{good}", "--mode", "sideways", code=EXIT_USAGE, says="argument --mode: invalid choice"),
    case(
        "submit", "{good}", "--repair", code=EXIT_USAGE, says="--repair adds what was wrong to a resend of --validate"
    ),
    case("status", "--limit", "0", code=EXIT_USAGE, says="argument --limit"),
    case("status", "job-1", "--watch", "--interval", "-1", code=EXIT_USAGE, says="argument --interval"),
    case("retry", "job-1", "--concurrency", "0", code=EXIT_USAGE, says="argument --concurrency"),
    case("retry", "job-1", "--max-attempts", "-1", code=EXIT_USAGE, says="argument --max-attempts"),
    case("retry", "job-1", "--deadline-hours", "-1", code=EXIT_USAGE, says="argument --deadline-hours"),
    case("retry", "job-1", "--interval", "0", code=EXIT_USAGE, says="argument --interval"),
    case("results", "job-1", "--out", "{file}", code=EXIT_USAGE, says="is a file, not a directory"),
    case("cancel", code=EXIT_USAGE, says="the following arguments are required: job"),
    case("frobnicate", code=EXIT_USAGE, says="invalid choice: 'frobnicate'"),
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
        ("csv", "line 1, column 1: not JSON"),
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
    case(
        "run",
        "{good}",
        "--provider",
        "anthropic",
        code=EXIT_PROVIDER,
        says="Check ANTHROPIC_BASE_URL",
        ANTHROPIC_BASE_URL=REFUSED.removesuffix("/v1"),
    ),
    case(
        "run",
        "{good}",
        "--provider",
        "anthropic",
        code=EXIT_USAGE,
        says="ANTHROPIC_BASE_URL='api.anthropic.com' is",
        ANTHROPIC_BASE_URL="api.anthropic.com",
        OPENAI_BASE_URL=REFUSED,
    ),
    # Anthropic's SDK adds /v1 itself: with it in the variable, the real API answers 404
    case(
        "run",
        "{good}",
        "--provider",
        "anthropic",
        code=EXIT_USAGE,
        says="ANTHROPIC_BASE_URL='http://127.0.0.1:9/v1' ends in /v1",
        ANTHROPIC_BASE_URL="http://127.0.0.1:9/v1",
    ),
    # before any work, whatever the provider's variables say
    case(
        "run",
        "{good}",
        "--provider",
        "anthropic",
        "--mode",
        "background",
        code=EXIT_USAGE,
        says="--mode background: the anthropic provider has no background responses Sluice can run; use one of direct",
        ANTHROPIC_BASE_URL=REFUSED,
    ),
    case(
        "submit",
        "{good}",
        "--provider",
        "anthropic",
        "--mode",
        "background",
        code=EXIT_USAGE,
        says="sluice-mode=background: the anthropic provider has no background responses",
    ),
    case("estimate", "{good}", "--provider", "mistral", code=EXIT_USAGE, says="argument --provider: invalid choice"),
]

DEPLOYED_WITHOUT_AWS = [
    case("status", "reviews-0123456789ab", code=EXIT_AWS, says="a job id printed by `sluice run` is a local job"),
    case("results", "reviews-0123456789ab", code=EXIT_AWS, says="no AWS region"),
    case("cancel", "reviews-0123456789ab", code=EXIT_AWS, says="no AWS region"),
]

# what a new user tried in their first hour (issue 31): each refused before any work, with its
# documented code, one message that says what to do, and nothing left behind
FIRST_HOUR = [
    case(code=EXIT_USAGE, says="On this machine:        sluice run FILE"),
    case("run", "{gz}", code=EXIT_INPUT, says="is gzip-compressed, and the input is read as plain JSONL"),
    case("estimate", "{gz}", code=EXIT_INPUT, says="gunzip -c"),
    case("submit", "{gz}", code=EXIT_INPUT, says="gunzip -c"),
    case("run", "{zip}", code=EXIT_INPUT, says="is zip-compressed"),
    case("run", "{llama}", "--budget", "5", code=EXIT_USAGE, says="'llama-3-8b' (the file's lines) has none"),
    case("run", "{llama}", "--budget", "5", code=EXIT_USAGE, says="(no model)"),
    case("run", "{good}", "--budget", "5", "--model", "my-model", code=EXIT_USAGE, says="'my-model' (--model)"),
    case("run", "{huge}", "--out", "{new_out}", code=EXIT_INPUT, says="bytes; a line may hold at most 1,000,000"),
    case("run", "{cut}", "--out", "{new_out}", code=EXIT_INPUT, says="line 2, column"),
    case("run", "{good}", "--out", "{under_file}", code=EXIT_USAGE, says="is a file, not a directory"),
    case("run", "{good}", "--model", code=EXIT_USAGE, says="argument --model: expected one argument"),
    case("run", "{good}", "--max-attempts", "two", code=EXIT_USAGE, says="'two' is not a whole number"),
    case("run", "{good}", "--shard-lines", "1.5", code=EXIT_USAGE, says="'1.5' is not a whole number"),
    case("run", "{good}", "--latency", "nan", code=EXIT_USAGE, says="not a finite number"),
    case("run", "{good}", "--budget", "$5", code=EXIT_USAGE, says="--budget"),
    case("run", "{good}", "--mode", "Batch", code=EXIT_USAGE, says="argument --mode: invalid choice"),
    case("run", "{good}", "--cache-dir", "{file}", code=EXIT_USAGE, says="--cache-dir: cannot write"),
    case("run", "{good}", code=EXIT_USAGE, says="is not an http(s) URL", OPENAI_BASE_URL="ftp://127.0.0.1/v1"),
    case("cache", "tidy", code=EXIT_USAGE, says="argument action: invalid choice: 'tidy'"),
    case("simulator", "--api-key", code=EXIT_USAGE, says="argument --api-key: expected one argument"),
]

TABLE = BAD_ARGUMENTS + BAD_FILES + PROVIDERS + DEPLOYED_WITHOUT_AWS + FIRST_HOUR


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
    assert "Traceback" not in out + err and "Error:" not in err
    # refused before any work: no output directory was made for it
    assert not Path(files["new_out"]).exists()
    # the message is about the user's flags and files, never the settings the CLI passes on (`sluice`
    # alone prints the help, whose exit codes name SLUICE_DEBUG)
    assert "SLUICE_" not in err or not row.argv
    assert out == "", out


def test_a_bug_is_one_line_and_exit_70_and_the_traceback_only_on_request(
    files: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sluice_local.inputs

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(sluice_local.inputs, "check_file", broken)
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
    flat = " ".join(out.split())
    assert "(default: 8000;" in flat and "a request without one is refused as its provider refuses it" in flat
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
        [sys.executable, "-m", "sluice_local.cli", *args],
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


def test_a_404_on_models_is_said_as_a_warning_before_the_run_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    with SimulatorServer(SimConfig(latency_s=0)) as sim:
        wrong = sim.base_url.removesuffix("/v1") + "/wrong/v1"
        check_provider(wrong, "sk-x")
    err = capsys.readouterr().err
    assert f"warning: provider {wrong} answered HTTP 404 to GET /models" in err
    assert "usually ends in /v1" in err


def test_cache_clear_answers_in_json_when_asked(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = sluice_in_process(["cache", "clear", "--json", "--cache-dir", files["dir"]], capsys)
    assert code == 0
    assert orjson.loads(out) == {"dir": files["dir"], "removed_files": 0}


def test_run_help_says_what_each_choice_does_and_how_a_signal_ends_a_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = sluice_in_process(["run", "--help"], capsys)
    text = " ".join(out.split())
    assert code == 0
    # the URL alone chooses the provider; the key is optional; each family reads its SDK's variables
    assert "the provider is OPENAI_BASE_URL when it is set" in text and "if both are set" not in text
    assert "with --provider anthropic it is ANTHROPIC_BASE_URL (with ANTHROPIC_API_KEY)" in text
    assert "whatever its body says (its body.model)" in text
    assert "auto (batch for a shard of 1,000 requests or more, direct for a smaller one)" in text
    assert "SIGTERM and SIGHUP do the same without the wait" in text and "130, 143 or 129" in text
    assert "143 for SIGTERM and 129 for SIGHUP" in text
    assert "--model" in text and "sends of a request at most, in all" in text


def test_the_cli_docs_and_the_help_list_the_same_exit_codes() -> None:
    from sluice_local.console import EXIT_CODES_HELP

    docs = (ROOT / "docs" / "cli.md").read_text()
    listed = docs.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    in_docs = {int(n) for n in re.findall(r"^\| (\d+) \|", listed, flags=re.M)}
    in_help = {int(n) for n in re.findall(r"^  (\d+) ", EXIT_CODES_HELP, flags=re.M)}
    assert in_docs == in_help
    # how a signal ends `sluice run`, in both and in the table of how a job ends
    for text in (listed, " ".join(EXIT_CODES_HELP.split())):
        assert "143" in text and "129" in text
    cancelled = next(line for line in docs.splitlines() if line.startswith("| `CANCELLED`"))
    assert "130 (Ctrl-C), 143 (SIGTERM), 129 (SIGHUP)" in cancelled
