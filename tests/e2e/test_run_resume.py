"""Ctrl-C during `sluice run` and a run again with the same cache: each line goes to the provider once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson

from sluice_local.simulator import SimConfig, SimulatorServer
from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
SENT = ("/v1/chat/completions", "/v1/responses")
KEY = "sk-resume-test-key"


def _ctrl_c_as_at_a_terminal() -> None:
    # a suite started in the background inherits SIGINT ignored, and so would `sluice run`
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sent(provider: SimulatorServer) -> list[str]:
    return [str(e["custom_id"]) for e in provider.log if e["method"] == "POST" and e["path"] in SENT]


def test_ctrl_c_then_a_rerun_sends_each_line_exactly_once(tmp_path: Path) -> None:
    lines = 300
    concurrency = 10
    path = write_jsonl(tmp_path / "long.jsonl", [request_line(f"i-{n}", f"review {n}") for n in range(lines)])
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}", "OPENAI_API_KEY": KEY}

    def command(out: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "sluice_local.cli",
            "run",
            str(path),
            "--out",
            str(out),
            "--cache-dir",
            str(cache),
        ]

    with SimulatorServer(SimConfig(latency_s=0.3, api_key=KEY)) as provider:
        env["OPENAI_BASE_URL"] = provider.base_url
        proc = subprocess.Popen(
            [*command(tmp_path / "interrupted"), "--quiet", "--concurrency", str(concurrency)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_ctrl_c_as_at_a_terminal,
        )
        deadline = time.monotonic() + 120
        while len(_sent(provider)) < lines // 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        at_ctrl_c = len(_sent(provider))
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 130, stderr.decode()[-3000:]
        # the simulator logs a request once it has answered it: nothing may still be on its way
        time.sleep(1.0)
        before = Counter(_sent(provider))
        assert lines // 3 <= sum(before.values()) < lines
        # the shards stop taking lines at once: after the Ctrl-C only what was in flight is answered
        assert sum(before.values()) - at_ctrl_c <= 2 * concurrency

        rerun = subprocess.run(
            [*command(tmp_path / "resumed"), "--quiet", "--concurrency", str(concurrency)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=300,
        )
        assert rerun.returncode == 0, rerun.stderr.decode()[-3000:]
        total = Counter(_sent(provider))

    # every request the provider got before the Ctrl-C (and the ones in flight at it) was paid for
    # once: its answer is in the cache, and the run again sends only the others
    assert total == Counter({f"i-{n}": 1 for n in range(lines)}), {k: v for k, v in total.items() if v != 1}
    summary = orjson.loads((tmp_path / "resumed" / "long.summary.json").read_bytes())
    assert summary["cache"]["hits"] == sum(before.values())
    assert summary["cache"]["misses"] == lines - sum(before.values())
    results = [orjson.loads(r) for r in (tmp_path / "resumed" / "long.results.jsonl").read_bytes().splitlines()]
    assert [r["custom_id"] for r in results] == [f"i-{n}" for n in range(lines)]
    # the interrupted run's outputs hold every answer the provider gave it, the in-flight ones too;
    # the rest are `cancelled`
    first = tmp_path / "interrupted"
    kept = [orjson.loads(r)["custom_id"] for r in (first / "long.results.jsonl").read_bytes().splitlines()]
    errors = [orjson.loads(e) for e in (first / "long.errors.jsonl").read_bytes().splitlines()]
    assert Counter(kept) == before
    assert {e["error"]["code"] for e in errors} == {"cancelled"}
    assert len(kept) + len(errors) == lines
