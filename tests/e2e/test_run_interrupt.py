"""Signals during `sluice run`: the job is cancelled, every line is accounted for, and the
results hold every answer the provider gave, exactly the answers the response cache holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
from sluice.cache.entries import SEGMENTS, DirStore, stats
from sluice.merge.verify import verify
from sluice.providers import OPENAI

from sluice_local.simulator import SimConfig, SimulatorServer
from tests.conftest import write_jsonl

ROOT = Path(__file__).resolve().parents[2]
LINES = 300


def _terminal_signals() -> None:
    # A suite started in the background by a non-interactive shell inherits SIGINT ignored,
    # and so would `sluice run` (Python keeps an inherited SIG_IGN): give it a terminal's default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _distinct(n: int) -> list[bytes]:
    # no max_tokens: an answer cut short by it is never kept, and this test counts what is kept
    return [
        orjson.dumps(
            {
                "custom_id": f"l-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"review {i}: fine"}]},
            }
        )
        + b"\n"
        for i in range(n)
    ]


def _answers_filed(cache: Path) -> int:
    """Answers appended to the cache so far, indexed or not: each is one row, written the moment it arrives."""
    folder = cache / SEGMENTS
    return sum(p.read_bytes().count(b"\n") for p in folder.iterdir()) if folder.is_dir() else 0


def _interrupt(tmp_path: Path, *signals: signal.Signals) -> tuple[int, str, Path, Path, Path]:
    """Run a job with answers arriving all the time, send `signals` once some are in, and return
    (exit code, stderr, input, outputs, cache)."""
    path = write_jsonl(tmp_path / "long.jsonl", _distinct(LINES))
    out, cache = tmp_path / "out", tmp_path / "cache"
    command = [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--out", str(out), "--cache-dir", str(cache)]
    command += ["--concurrency", "20", "--quiet"]
    # answers take 0.2 to 3.2 s: they arrive all the time, and some are still coming seconds after a signal
    with SimulatorServer(SimConfig(latency_s=0.2, jitter_s=3.0)) as provider:
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}", "OPENAI_BASE_URL": provider.base_url}
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_terminal_signals
        )
        deadline = time.monotonic() + 120
        # some answers are checkpointed, some only filed, and 20 requests are in flight
        while _answers_filed(cache) < 15 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.stderr is not None
        seen = b""
        for n, signum in enumerate(signals):
            if n:
                # pressed again once the first has been seen to take effect, as a person would
                while b"cancelling" not in seen and proc.poll() is None:
                    seen += proc.stderr.readline()
            proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    return proc.returncode, (seen + stderr).decode(), path, out, cache


def _check_outputs(path: Path, out: Path, cache: Path) -> tuple[list[bytes], list[bytes]]:
    summary = orjson.loads((out / "long.summary.json").read_bytes())
    assert summary["status"] == "CANCELLED"
    results = (out / "long.results.jsonl").read_bytes().splitlines()
    errors = (out / "long.errors.jsonl").read_bytes().splitlines()
    assert 0 < len(results) < LINES
    assert {orjson.loads(e)["error"]["code"] for e in errors} == {"cancelled"}
    # every answer the provider gave is in the results: the cache holds no answer they lack
    assert _answers_filed(cache) == stats(DirStore(cache), OPENAI)["answers"] == len(results)
    report = verify(path.read_bytes().splitlines(keepends=True), results, errors, summary)
    assert report.ok, report.describe()
    return results, errors


def test_two_ctrl_c_keep_every_answer_and_exit_130(tmp_path: Path) -> None:
    code, stderr, path, out, cache = _interrupt(tmp_path, signal.SIGINT, signal.SIGINT)

    assert code == 130, stderr[-2000:]
    assert "cancelling" in stderr and "Traceback" not in stderr
    # one word for a cancelled job: the terminal says what the summary says, never the execution's ABORTED
    assert ": CANCELLED" in stderr and "ABORTED" not in stderr
    _check_outputs(path, out, cache)
    assert "without" not in stderr  # nothing is ever quit without writing


def test_sigterm_writes_the_outputs_and_exits_143(tmp_path: Path) -> None:
    code, stderr, path, out, cache = _interrupt(tmp_path, signal.SIGTERM)

    assert code == 143, stderr[-2000:]
    assert "SIGTERM: stopping the job" in stderr and "Traceback" not in stderr
    _check_outputs(path, out, cache)
