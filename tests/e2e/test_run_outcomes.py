"""`sluice run` in every mode on the README's example, and exit codes that say how the job ended."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from sluice.merge.verify import verify

from tests.conftest import request_line, write_jsonl
from tests.e2e.helpers.cli import ROOT, clean_env, sluice

EXAMPLE = ROOT / "examples" / "reviews.jsonl"
# a few seconds on a quiet machine; minutes on a 2-core one the whole suite shares
LOCAL_RUN_TIMEOUT_S = 300


@pytest.mark.parametrize("mode", ["direct", "background", "batch", "auto"])
def test_the_example_runs_in_every_mode_with_no_errors_in_input_order(mode: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ("--out", str(out), "--mode", mode, "--latency", "0.01", "--quiet")
    done = sluice("run", str(EXAMPLE), *args, env=clean_env(), timeout=LOCAL_RUN_TIMEOUT_S)

    assert done.returncode == 0, done.stderr[-2000:]
    assert "SUCCEEDED" in done.stderr and "0 errors" in done.stderr
    inputs = EXAMPLE.read_bytes().splitlines(keepends=True)
    results = (out / "reviews.results.jsonl").read_bytes().splitlines()
    errors = (out / "reviews.errors.jsonl").read_bytes().splitlines()
    summary = orjson.loads((out / "reviews.summary.json").read_bytes())
    assert errors == [] and len(results) == len(inputs)
    assert [orjson.loads(r)["custom_id"] for r in results] == [orjson.loads(line)["custom_id"] for line in inputs]
    assert verify(inputs, results, errors, summary).ok
    paths = summary["lines_by_path"]
    assert sum(paths.values()) == len(inputs)
    if mode == "background":
        # the example is half chat completions, which have no background form
        assert paths == {"background": 1000, "direct": 1000}
    if mode == "batch":
        assert paths == {"batch": 2000}


def provider_rejects(custom_id: str) -> bytes:
    """A well-formed line the provider answers 400 (no messages): it passes every local check."""
    body = {"model": "gpt-4o-mini", "messages": []}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}) + b"\n"


def test_a_run_with_failed_lines_exits_9_unless_the_max_error_rate_allows_them(tmp_path: Path) -> None:
    lines = [request_line(f"r-{n}") for n in range(18)] + [provider_rejects("bad-1"), provider_rejects("bad-2")]
    path = write_jsonl(tmp_path / "some.jsonl", lines)

    strict = sluice(
        "run",
        str(path),
        "--out",
        str(tmp_path / "strict"),
        "--latency",
        "0.01",
        env=clean_env(),
        timeout=LOCAL_RUN_TIMEOUT_S,
    )
    assert strict.returncode == 9, strict.stderr[-2000:]
    assert "COMPLETED_WITH_ERRORS" in strict.stderr and "18 results, 2 errors" in strict.stderr
    summary = orjson.loads((tmp_path / "strict" / "some.summary.json").read_bytes())
    assert summary["status"] == "COMPLETED_WITH_ERRORS" and summary["error_rate"] == 0.1
    report = (tmp_path / "strict" / "some.report.html").read_text()
    assert '<span class="status warn">COMPLETED_WITH_ERRORS</span>' in report and ">SUCCEEDED<" not in report

    allowed = sluice(
        "run", str(path), "--out", str(tmp_path / "allowed"), "--latency", "0.01", "--max-error-rate", "0.1",
        env=clean_env(),
        timeout=LOCAL_RUN_TIMEOUT_S,
    )  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "SUCCEEDED" in allowed.stderr
    # within the allowance, yet never green with lines in errors
    assert '<span class="status warn">SUCCEEDED</span>' in (tmp_path / "allowed" / "some.report.html").read_text()


@pytest.mark.parametrize("value", ["2", "-0.5", "ten", "5%"])
def test_a_max_error_rate_outside_0_to_1_is_refused_naming_the_flag(value: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "one.jsonl", [request_line("a")])
    done = sluice("run", str(path), "--out", str(tmp_path / "out"), f"--max-error-rate={value}", env=clean_env())
    assert done.returncode == 2
    assert "--max-error-rate" in done.stderr and "from 0 to 1" in done.stderr
    assert "Traceback" not in done.stderr and "SLUICE_" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_run_that_reaches_its_budget_exits_10_with_the_unsent_lines_in_errors(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "capped.jsonl", [request_line(f"c-{n}") for n in range(40)])
    # each line's worst case is about $0.00062 (no max_tokens: 1,024 output tokens are assumed) and
    # an answer costs about $0.0000025: the cap leaves room for a dozen answers
    done = sluice(
        "run", str(path), "--out", str(tmp_path / "out"), "--latency", "0.01", "--budget", "0.00065",
        env=clean_env(),
        timeout=LOCAL_RUN_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 10, done.stderr[-2000:]
    assert "BUDGET_EXCEEDED" in done.stderr and "lines not sent" in done.stderr
    # advice a local run can follow: there is no `sluice retry` for it, but the cache keeps what was answered
    assert "run the same file again with a higher --budget: the response cache answers" in done.stderr
    errors = (tmp_path / "out" / "capped.errors.jsonl").read_text()
    assert "sluice retry" not in done.stderr + errors
    summary = orjson.loads((tmp_path / "out" / "capped.summary.json").read_bytes())
    assert summary["status"] == "BUDGET_EXCEEDED" and summary["budget"]["spent_usd"] <= 0.00065
    assert summary["errors_by_code"] == {"budget_exceeded": summary["counts"]["errors"]}
    assert summary["counts"]["results"] + summary["counts"]["errors"] == 40 and summary["counts"]["results"] > 0


@pytest.mark.parametrize("value", ["0", "-1", "ten", "nan"])
def test_a_bad_budget_is_refused_naming_the_flag(value: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "one.jsonl", [request_line("a")])
    done = sluice("run", str(path), "--out", str(tmp_path / "out"), f"--budget={value}", env=clean_env())
    assert done.returncode == 2
    assert "--budget" in done.stderr and "US dollars" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_cache_directory_that_cannot_be_written_is_refused_before_the_job(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "one.jsonl", [request_line("a")])
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = sluice(
        "run", str(path), "--out", str(tmp_path / "out"), "--cache-dir", str(blocker / "cache"), env=clean_env()
    )
    assert done.returncode == 2, done.stderr
    assert "--cache-dir" in done.stderr and str(blocker / "cache") in done.stderr
    assert "Traceback" not in done.stderr and "started" not in done.stdout
