"""`sluice run --provider gemini` as a user types it, at a Gemini-compatible server that imports
nothing of Sluice (`bench/gemini_server.py`, written from Google's REST reference): reached as
Google's SDK reaches it, GOOGLE_GEMINI_BASE_URL and GEMINI_API_KEY (else GOOGLE_API_KEY) sent as
x-goog-api-key, its own answers back as chat completions, its 429s waited out."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from bench.gemini_server import ANSWER_PREFIX, GeminiServer, Running
from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
MODEL = "gemini-2.5-flash"
KEY = "gemini-users-own-key"


def _run(path: Path, out: Path, **variables: str) -> tuple[subprocess.CompletedProcess[bytes], Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "GEMINI_", "GOOGLE_"))}
    env.update(PYTHONPATH=f"{ROOT / 'functions'}:{ROOT}", **variables)
    command = [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--provider", "gemini", "--model", MODEL]
    done = subprocess.run(
        [*command, "--no-cache", "--mode", "direct", "--out", str(out)], cwd=ROOT, env=env, capture_output=True
    )
    summary = out / f"{path.stem}.summary.json"
    return done, orjson.loads(summary.read_bytes()) if summary.exists() else {}


def _bodies(out: Path, stem: str) -> list[dict[str, Any]]:
    lines = (out / f"{stem}.results.jsonl").read_bytes().splitlines()
    return [orjson.loads(line)["response"]["body"] for line in lines]


def test_a_third_party_gemini_server_answers_300_chat_lines_direct_with_its_own_text(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", [request_line(f"g-{n}", f"review number {n}") for n in range(300)])
    with Running(GeminiServer(key=KEY)) as server:
        done, summary = _run(path, tmp_path / "out", GOOGLE_GEMINI_BASE_URL=server.base_url, GEMINI_API_KEY=KEY)

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    stderr = done.stderr.decode()
    assert f"provider: {server.base_url}" in stderr and "SIMULATOR" not in stderr
    assert KEY not in stderr and KEY not in (tmp_path / "out" / "chat.summary.json").read_text()
    assert server.answered == 300 and not server.refused and server.models == {MODEL: 300}
    assert server.key_digests == {hashlib.sha256(KEY.encode()).hexdigest()[:12]: 300}
    assert summary["status"] == "SUCCEEDED" and summary["counts"] == {**summary["counts"], "results": 300, "errors": 0}
    bodies = _bodies(tmp_path / "out", "chat")
    assert [b["object"] for b in bodies] == ["chat.completion"] * 300
    texts = [b["choices"][0]["message"]["content"] for b in bodies]
    assert all(text.startswith(ANSWER_PREFIX) for text in texts)
    # its own words for each prompt, in input order
    assert len(set(texts)) == 300
    assert summary["cost_estimate_usd"]["provider"] > 0


def test_googles_key_variable_is_read_and_a_quota_429_is_waited_out(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "quota.jsonl", [request_line(f"q-{n}", f"review {n}") for n in range(40)])
    # each 429 asks for 3 s in its RetryInfo, longer than Sluice's own first backoff
    with Running(GeminiServer(key=KEY, throttle_every=10, retry_delay_s=3)) as server:
        done, summary = _run(path, tmp_path / "out", GOOGLE_GEMINI_BASE_URL=server.base_url, GOOGLE_API_KEY=KEY)

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert server.refused["RESOURCE_EXHAUSTED"] >= 3
    assert server.answered == 40
    assert summary["status"] == "SUCCEEDED" and summary["counts"]["errors"] == 0
    assert summary["retries_by_cause"]["throttled"] == summary["throttled"] == server.refused["RESOURCE_EXHAUSTED"]
    assert summary["wall_seconds"] >= 3.0
