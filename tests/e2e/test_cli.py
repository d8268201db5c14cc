"""`sluice` driven as a user would, on this machine: a subprocess with real arguments (`run`,
`estimate`, `simulator`, and what a command without AWS credentials says). The deployed commands
are test_cli_deployed's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from tests.conftest import request_line, write_jsonl
from tests.e2e.cli_env import REGION, ROOT, clean_env, parse_html, sluice


def test_run_writes_the_outputs_and_a_report_linked_from_the_last_line(tmp_path: Path) -> None:
    lines = [request_line(f"r-{n}") for n in range(30)]
    lines[4] = b'{"custom_id": "r-4", "method": "POST",\n'
    path = write_jsonl(tmp_path / "local.jsonl", lines)
    out = tmp_path / "out"
    # the one bad line is allowed in, and within the job's allowance, so it SUCCEEDED
    args = ("--shard-lines", "10", "--latency", "0.01", "--allow-invalid", "--max-error-rate", "0.05")
    done = sluice("run", str(path), "--out", str(out), *args, env=clean_env())

    assert done.returncode == 0, done.stderr
    assert "SIMULATOR" in done.stderr and "SUCCEEDED" in done.stderr
    last = done.stdout.strip().splitlines()[-1]
    report = out / "local.report.html"
    assert last == f"report: {report.resolve().as_uri()}"
    summary = orjson.loads((out / "local.summary.json").read_bytes())
    assert summary["counts"]["results"] == 29 and summary["counts"]["errors"] == 1
    tags = parse_html(report)
    assert tags.count("rect", "bar") == len(summary["latency_histogram"]) > 0
    assert tags.count("rect", "rate") >= 1
    assert len((out / "local.results.jsonl").read_bytes().splitlines()) == 29

    outputs = [str(out / f"local.{kind}.jsonl") for kind in ("results", "errors")]
    verified = sluice("verify", str(path), *outputs, "--summary", str(out / "local.summary.json"), env=clean_env())
    assert verified.returncode == 0 and verified.stdout.startswith("OK: 30 input lines"), verified.stdout
    broken = sluice("verify", str(path), outputs[0], str(write_jsonl(tmp_path / "none.jsonl", [])), env=clean_env())
    assert broken.returncode == 1 and "input line 5 (None) is in neither results nor errors" in broken.stdout


def test_a_runs_time_is_the_whole_commands_as_time_counts_it(tmp_path: Path) -> None:
    """It said 7.3 s while `time` said 11.1 s: the interpreter's start, and its second of tearing
    down the local cloud's objects after the last line, went uncounted."""
    path = write_jsonl(tmp_path / "timed.jsonl", [request_line(f"t-{n}") for n in range(5)])
    began = time.monotonic()
    done = sluice("run", str(path), "--out", str(tmp_path / "out"), "--quiet", "--latency", "0.01", env=clean_env())
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    said = float(re.findall(r"\(([\d.]+) s with the local cloud\)", done.stderr)[0])
    # what is left: the report's writing and the process's own exit
    assert said <= wall + 0.05 and wall - said < 0.75, (said, wall)


def test_the_process_start_is_when_the_command_began() -> None:
    code = (
        "import time; time.sleep(0.5); from sluice_local.cli.app import process_started; "
        "print(time.monotonic() - process_started())"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert 0.5 <= float(done.stdout) < 5


def test_simulator_serves_until_stopped() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice_local.cli", "simulator", "--port", "0", "--latency", "0"],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "simulator listening on http://127.0.0.1:" in first
        base = first.split("listening on ", 1)[1].strip().removesuffix("/v1")
        with urllib.request.urlopen(f"{base}/sim/health", timeout=10) as answer:
            assert answer.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_estimate_counts_requests_and_prices_direct_and_batch(tmp_path: Path) -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 5}
    lines = [
        orjson.dumps({"custom_id": f"e-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + b"\n"
        for n in range(10)
    ]
    path = write_jsonl(tmp_path / "est.jsonl", [*lines, b"\n"])
    done = sluice("estimate", str(path), "--json", env=clean_env())

    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["requests"], data["lines"], data["blank"]) == (10, 11, 1)
    model = data["models"]["gpt-4o-mini"]
    assert model["output_tokens"] == 50 and model["input_tokens"] == 10 * (100 + 4)
    assert model["batch_usd"] == pytest.approx(model["direct_usd"] / 2, rel=1e-3)
    assert data["provider_usd"]["batch"] < data["provider_usd"]["direct"] and data["aws_usd"] > 0

    text = sluice("estimate", str(path), "--model", "gpt-4o", env=clean_env())
    assert text.returncode == 0 and "gpt-4o " in text.stdout and "batch" in text.stdout


def test_bad_input_says_where_and_exits_3(tmp_path: Path) -> None:
    env = clean_env()
    missing = sluice("estimate", str(tmp_path / "nope.jsonl"), env=env)
    assert missing.returncode == 3 and f"no such file: {tmp_path / 'nope.jsonl'}" in missing.stderr

    lines = [request_line("a"), b'{"custom_id": "b", "method": "POST",\n', request_line("c"), request_line("a")]
    bad = write_jsonl(tmp_path / "bad.jsonl", lines)
    # submit checks the file before it needs AWS: no credentials are set here
    done = sluice("submit", str(bad), "--env", "dev", env=env)
    assert done.returncode == 3
    assert "2 invalid line(s) of 4" in done.stderr
    assert "line 2, column 37: not JSON: it ends before the JSON does (cut short?)" in done.stderr
    assert "line 4: duplicate custom_id 'a' (first on line 1)" in done.stderr
    assert done.stdout == ""

    option = sluice(
        "submit", str(write_jsonl(tmp_path / "ok.jsonl", [request_line("a")])), "--mode", "sideways", env=env
    )
    assert option.returncode == 2 and "argument --mode: invalid choice: 'sideways'" in option.stderr


def test_without_aws_credentials_exits_5(tmp_path: Path) -> None:
    env = clean_env(
        AWS_DEFAULT_REGION=REGION,
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    done = sluice("status", "--env", "dev", env=env)
    assert done.returncode == 5 and "no AWS credentials" in done.stderr
