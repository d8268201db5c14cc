"""Deployed, a job resumes through the response cache: `sluice retry JOB` and a re-upload of an
edited file send only what is not already answered.

The environment is test_cli's: `sluice` as a subprocess against moto in server mode, the core
(plan, shards, merge) run here against the same server, the simulator as the provider.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from tests.conftest import request_line, write_jsonl
from tests.e2e.helpers import cli
from tests.e2e.helpers.cli import BUCKET, Deployed, errors_of
from tests.e2e.helpers.deployed_resume import run_pipeline

moto_endpoint = cli.moto_endpoint
deployed = cli.deployed

SENT = ("/v1/chat/completions", "/v1/responses")


def sent(sim: Any) -> Counter[str]:
    """How many times the provider got each custom_id."""
    return Counter(str(e["custom_id"]) for e in sim.log if e["method"] == "POST" and e["path"] in SENT)


def results_of(env: Deployed, key: str) -> list[dict[str, Any]]:
    body = env.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    return [orjson.loads(row) for row in body.splitlines()]


def test_retry_sends_only_the_failed_lines_and_takes_what_another_job_answered_from_the_cache(
    deployed: Deployed, tmp_path: Path
) -> None:
    deployed.sim.configure(rate_500=0.4)
    lines = [request_line(f"f-{n}", f"review {n}") for n in range(30)]
    path = write_jsonl(tmp_path / "flaky.jsonl", lines)
    submitted = deployed.cli("submit", str(path), "--max-attempts", "1", "--quiet")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    first = run_pipeline(deployed, "inbox/flaky.jsonl", max_attempts=1)
    answered = {str(e["custom_id"]) for e in deployed.sim.log if e["path"] in SENT and e["status"] == 200}
    failed = [e["custom_id"] for e in errors_of(deployed, "outbox/flaky.errors.jsonl")]
    assert first["errors_by_code"] == {"retries_exhausted": len(failed)}
    assert len(failed) >= 4 and set(failed) == {f"f-{n}" for n in range(30)} - answered

    # another job, under other custom_ids, asks two of the failed requests and gets them answered
    deployed.sim.configure(rate_500=0.0)
    by_id = {f"f-{n}": n for n in range(30)}
    borrowed = failed[:2]
    other = write_jsonl(
        tmp_path / "other.jsonl", [request_line(f"o-{by_id[c]}", f"review {by_id[c]}") for c in borrowed]
    )
    assert deployed.cli("submit", str(other), "--quiet").returncode == 0
    assert run_pipeline(deployed, "inbox/other.jsonl")["status"] == "SUCCEEDED"

    deployed.sim.clear_log()
    retried = deployed.cli("retry", job_id, "--quiet")
    assert retried.returncode == 0, retried.stderr
    summary = run_pipeline(deployed, "inbox/flaky.retry-1.jsonl")

    # the provider got each failed line it had not answered yet, once, and nothing else
    assert sent(deployed.sim) == Counter({c: 1 for c in failed[2:]})
    assert summary["status"] == "SUCCEEDED"
    assert summary["cache"]["hits"] == 2 and summary["cache"]["misses"] == len(failed) - 2
    results = results_of(deployed, "outbox/flaky.retry-1.results.jsonl")
    assert [r["custom_id"] for r in results] == sorted(failed, key=by_id.__getitem__)
    assert {r["custom_id"] for r in results if r.get("cached")} == set(borrowed)
    # a retry of the retry has nothing left to send
    again = deployed.cli("retry", retried.stdout.strip(), "--quiet")
    assert again.returncode == 0 and "no failed lines to retry" in again.stderr


def test_a_reupload_of_an_edited_file_sends_exactly_the_edited_lines(deployed: Deployed, tmp_path: Path) -> None:
    lines = [request_line(f"e-{n}", f"review {n}") for n in range(60)]
    path = write_jsonl(tmp_path / "reviews.jsonl", lines)
    assert deployed.cli("submit", str(path), "--quiet").returncode == 0
    first = run_pipeline(deployed, "inbox/reviews.jsonl")
    assert first["status"] == "SUCCEEDED" and sum(sent(deployed.sim).values()) == 60

    edited_at = list(range(3, 60, 6))
    for n in edited_at:
        lines[n] = request_line(f"e-{n}", f"review {n}, edited")
    edited = write_jsonl(tmp_path / "edited.jsonl", lines)
    deployed.sim.clear_log()
    submitted = deployed.cli("submit", str(edited), "--name", "reviews-v2", "--quiet")
    assert submitted.returncode == 0, submitted.stderr
    second = run_pipeline(deployed, "inbox/reviews-v2.jsonl")

    assert sent(deployed.sim) == Counter({f"e-{n}": 1 for n in edited_at})
    assert second["cache"]["hits"] == 50 and second["cache"]["misses"] == 10
    results = results_of(deployed, "outbox/reviews-v2.results.jsonl")
    assert [r["custom_id"] for r in results] == [f"e-{n}" for n in range(60)]
    assert [n for n, r in enumerate(results) if not r.get("cached")] == edited_at
    # an unedited line's answer is the first job's, byte for byte in its response
    before = {r["custom_id"]: r["response"] for r in results_of(deployed, "outbox/reviews.results.jsonl")}
    assert all(r["response"] == before[r["custom_id"]] for r in results if r.get("cached"))
