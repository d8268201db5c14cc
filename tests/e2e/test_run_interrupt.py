"""Ctrl-C during `sluice run` cancels the job and still accounts for every line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
from sluice.verify import verify

from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _ctrl_c_as_at_a_terminal() -> None:
    # A suite started in the background by a non-interactive shell inherits SIGINT ignored,
    # and so would `sluice run` (Python keeps an inherited SIG_IGN): give it a terminal's default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_cancels_and_writes_what_finished(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "long.jsonl", [request_line(f"l-{n}") for n in range(300)])
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}"}
    env.pop("OPENAI_BASE_URL", None)
    env.pop("OPENAI_API_KEY", None)
    command = [sys.executable, "-m", "local.cli", "run", str(path), "--out", str(out), "--latency", "1.0"]
    command += ["--concurrency", "10", "--quiet"]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the provider line
    assert b"SIMULATOR" in first
    first += proc.stderr.readline()  # the job has started: on a busy machine that can take seconds
    assert b"started" in first
    time.sleep(8)  # some lines done (10 a second, a part every 3 s), most not
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    stderr = first + rest

    assert proc.returncode == 130, stderr.decode()[-2000:]
    assert b"cancelling" in stderr
    # one word for a cancelled job: the terminal says what the summary says, never the execution's ABORTED
    assert b": CANCELLED in " in stderr and b"ABORTED" not in stderr
    summary = orjson.loads((out / "long.summary.json").read_bytes())
    assert summary["status"] == "CANCELLED"
    results = (out / "long.results.jsonl").read_bytes().splitlines()
    errors = (out / "long.errors.jsonl").read_bytes().splitlines()
    assert 0 < len(results) < 300
    assert {orjson.loads(e)["error"]["code"] for e in errors} == {"cancelled"}
    report = verify(path.read_bytes().splitlines(keepends=True), results, errors, summary)
    assert report.ok, report.describe()
