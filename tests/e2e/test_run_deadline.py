"""`sluice run --deadline` as a user types it (issue 44): a deadline the batch meets is all batch at
half the direct price, one the key's rate cannot meet is refused before anything is sent, and a
deadline Sluice cannot read says why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _run(path: Path, out: Path, *options: str, **variables: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "AWS_"))}
    env.update(PYTHONPATH=f"{ROOT / 'functions'}:{ROOT}", **variables)
    command = [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--no-cache", "--out", str(out), *options]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    summary = out / f"{path.stem}.summary.json"
    return done, orjson.loads(summary.read_bytes()) if summary.exists() else {}


def test_a_deadline_the_batch_meets_is_all_batch_and_says_so(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "easy.jsonl", [request_line(f"e-{n}") for n in range(200)])
    done, summary = _run(
        path, tmp_path / "out", "--deadline", "30m", "--batch-turnaround", "2m", "--sim-batch-turnaround", "1",
        "--shard-lines", "100",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert summary["status"] == "SUCCEEDED" and summary["counts"]["results"] == 200
    deadline = summary["deadline"]
    assert deadline["met"] and deadline["shards_by_choice"] == {"batch": 2}
    assert [s["paths"] for s in summary["shards"]] == [{"batch": 100}, {"batch": 100}]
    costs = summary["cost_estimate_usd"]
    assert costs["provider"] == costs["provider_all_batch"] and costs["provider_all_direct"] > costs["provider"]
    assert "deadline " in done.stderr and ": met" in done.stderr and "2 batch" in done.stderr
    report = (tmp_path / "out" / "easy.report.html").read_text()
    assert "<h2>Deadline</h2>" in report and "cutover" in report


def test_a_deadline_the_key_cannot_meet_is_refused_with_the_earliest_finish(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "rushed.jsonl", [request_line(f"r-{n}") for n in range(300)])
    done, summary = _run(path, tmp_path / "out", "--deadline", "10s", "--rpm", "60")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "cannot be met" in done.stderr and "earliest finish Sluice can promise is" in done.stderr
    assert summary["status"] == "FAILED" and "counts" not in summary


def test_a_deadline_sluice_cannot_read_names_the_problem(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [request_line("b-0")])
    for deadline, said in (
        ("2020-01-01T00:00:00Z", "is in the past"),
        ("tomorrow-ish", "neither a duration"),
        ("2030-01-01T09:00:00", "has no time zone"),
    ):
        done, _ = _run(path, tmp_path / "out", "--deadline", deadline)
        assert done.returncode == 2 and said in done.stderr, (deadline, done.stderr[-800:])
        assert "Traceback" not in done.stderr
    done, _ = _run(path, tmp_path / "out", "--deadline", "1h", "--mode", "direct")
    assert done.returncode == 2 and "takes no --mode direct" in done.stderr, done.stderr[-800:]
    # a provider with no batch to choose: a Bedrock runtime endpoint of the user's
    done, _ = _run(
        path, tmp_path / "out", "--deadline", "1h", "--provider", "bedrock", "--model", "anthropic.claude-3-haiku-v1:0",
        AWS_ENDPOINT_URL_BEDROCK_RUNTIME="http://127.0.0.1:9", AWS_ACCESS_KEY_ID="AKID", AWS_SECRET_ACCESS_KEY="s",
    )  # fmt: skip
    assert done.returncode == 2 and "has no batch jobs: run without --deadline" in done.stderr, done.stderr[-800:]
