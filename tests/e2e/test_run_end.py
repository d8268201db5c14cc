"""How `sluice run` ends: one wall time for the job everywhere, --quiet as one line, the
provider's own words when it refused the job, and a budget that can be held checked first."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

import sluice_local.cli.run
from sluice_local.cli import main
from sluice_local.console import EXIT_PROVIDER, EXIT_USAGE
from tests.conftest import request_line, write_jsonl


@pytest.fixture(autouse=True)
def no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def _line(custom_id: str, model: str) -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": "Reply with one word: fine"}], "max_tokens": 5}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}) + b"\n"


def test_quiet_says_one_line_and_the_job_has_one_wall_time_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "five.jsonl", [request_line(f"q-{n}") for n in range(5)])
    out = tmp_path / "out"

    assert main(["run", str(path), "--out", str(out), "--quiet", "--latency", "0.01", "--concurrency", "7"]) == 0
    captured = capsys.readouterr()

    assert captured.out == ""
    [line] = captured.err.splitlines()
    summary = orjson.loads((out / "five.summary.json").read_bytes())
    job_s, command_s = re.findall(r"SUCCEEDED in ([\d.]+) s \(([\d.]+) s with the local cloud\)", line)[0]
    # the terminal's figure is the summary's (and the report's), and the whole command's is labelled apart
    assert float(job_s) == round(summary["wall_seconds"], 1)
    assert float(command_s) == round(summary["command_seconds"], 1) > float(job_s)
    report = (out / "five.report.html").read_text()
    assert "job wall time (Plan to Merge)" in report and "sluice run in all, with the local cloud" in report
    # how it ran: the provider and the settings, never a key
    assert summary["run"]["provider"].startswith("built-in simulator")
    assert summary["run"]["concurrency"] == 7 and summary["run"]["max_attempts"] == 0, "no cap: as the job needs"
    assert "sk-" not in (out / "five.summary.json").read_text() and "sk-" not in report


def test_a_provider_that_refused_the_job_is_quoted_with_the_likely_cause_and_exits_8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the shards' side of it (stop sending after the first answers are all the same refusal) is
    # the engine's; here the summary says so, as Merge writes it
    refused = {
        "status": 404,
        "message": "Unknown request URL: POST /wrong/v1/chat/completions",
        "cause": "the base URL's path is wrong (OPENAI_BASE_URL usually ends in /v1)",
        "lines": 1980,
    }
    written = sluice_local.cli.run.local_summary

    def with_refusal(*args: Any, **kwargs: Any) -> dict[str, Any]:
        summary = written(*args, **kwargs)
        summary["provider_refused"] = refused
        return summary

    monkeypatch.setattr(sluice_local.cli.run, "local_summary", with_refusal)
    path = write_jsonl(tmp_path / "wrong.jsonl", [request_line("w-1")])

    code = main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet", "--latency", "0"])
    err = capsys.readouterr().err

    assert code == EXIT_PROVIDER == 8
    assert "HTTP 404: Unknown request URL: POST /wrong/v1/chat/completions" in err
    assert "likely cause: the base URL's path is wrong (OPENAI_BASE_URL usually ends in /v1)" in err
    assert "1,980 lines not sent" in err


def test_a_budget_with_an_unpriced_model_is_refused_before_the_job_and_model_sends_to_a_priced_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "llama.jsonl", [_line(f"m-{n}", "llama-3-8b") for n in range(3)])
    out = tmp_path / "out"

    assert main(["run", str(path), "--out", str(out), "--budget", "1", "--quiet"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--budget needs a price for every model the job sends to, and 'llama-3-8b' (the file's lines)" in err
    assert "--model" in err and "sluice-model" not in err and "PlanError" not in err
    assert not out.exists()

    code = main(["run", str(path), "--out", str(out), "--budget", "1", "--model", "gpt-4o-mini", "--latency", "0"])
    assert code == 0, capsys.readouterr().err
    results = [orjson.loads(r) for r in (out / "llama.results.jsonl").read_bytes().splitlines()]
    assert {r["response"]["body"]["model"] for r in results} == {"gpt-4o-mini"}
