"""`sluice run` sends the job to the provider named by OPENAI_BASE_URL / OPENAI_API_KEY."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from local.simulator import SimConfig, SimulatorServer
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
        command = [sys.executable, "-m", "local.cli", "run", str(path), "--out", str(tmp_path / "out")]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=120)
        sent = {e["custom_id"] for e in provider.log if e["path"] == "/v1/chat/completions" and e["status"] == 200}

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert f"provider: {provider.base_url}".encode() in done.stderr
    assert b"SIMULATOR" not in done.stderr and b"warning" not in done.stderr
    assert sent == {f"p-{n}" for n in range(25)}
    results = (tmp_path / "out" / "mine.results.jsonl").read_bytes().splitlines()
    assert [orjson.loads(r)["custom_id"] for r in results] == [f"p-{n}" for n in range(25)]
