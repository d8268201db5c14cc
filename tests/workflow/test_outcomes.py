"""Every mode takes every endpoint, and a job's outcome says whether too many lines failed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import boto3
import orjson
import pytest
from sluice_handlers.runtime import Runtime

from sluice_local.cloud import run_job
from sluice_local.simulator import SimulatorServer
from tests.conftest import request_line, write_jsonl
from tests.workflow.helpers.outcomes import received, watch_events

URLS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions")


def mixed_line(n: int) -> bytes:
    """Line n of a file cycling through all four endpoints."""
    url = URLS[n % len(URLS)]
    if url != "/v1/completions":
        return request_line(f"m-{n}", f"review {n}", url=url)
    body = {"model": "gpt-3.5-turbo-instruct", "prompt": f"review {n}", "max_tokens": 4}
    return orjson.dumps({"custom_id": f"m-{n}", "method": "POST", "url": url, "body": body}) + b"\n"


def posts(simulator: SimulatorServer) -> Counter[tuple[str, str]]:
    """(path, custom_id) of every request the provider was sent directly."""
    return Counter((e["path"], e["custom_id"]) for e in simulator.log if e["method"] == "POST" and e["custom_id"])


@pytest.mark.parametrize("mode", ["direct", "background", "batch", "auto"])
def test_every_mode_runs_a_file_of_every_endpoint_in_input_order(
    mode: str, make_cloud, simulator: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud = make_cloud(shard_lines=40, batch_max_requests=40, poll_seconds=1)
    # auto: the two full shards go to the Batch API, the short last one directly
    monkeypatch.setenv("SLUICE_AUTO_BATCH_MIN_REQUESTS", "30")
    simulator.configure(batch_phase_s=0.1, webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret)
    path = write_jsonl(tmp_path / "mixed.jsonl", [mixed_line(n) for n in range(100)])
    run = run_job(cloud, path, metadata={"sluice-mode": mode})

    assert run.errors == [], run.errors[:3]
    assert [r["custom_id"] for r in run.results] == [f"m-{n}" for n in range(100)]
    assert run.verify(path).ok
    assert run.summary["status"] == "SUCCEEDED"
    objects = [r["response"]["body"]["object"] for r in run.results]
    assert objects[:4] == ["chat.completion", "response", "list", "text_completion"]
    expected = {
        "direct": {"direct": 100},
        "background": {"background": 25, "direct": 75},
        "batch": {"batch": 100},
        "auto": {"batch": 80, "direct": 20},
    }[mode]
    assert run.summary["lines_by_path"] == expected
    shard_paths = [s["paths"] for s in run.summary["shards"]]
    assert sum((Counter(p) for p in shard_paths), Counter()) == Counter(expected)

    sent = posts(simulator)
    if mode == "background":
        # only the Responses lines ran in the background; each line was sent once, and the rest directly
        assert all(r["response"]["body"]["background"] for r in run.results if r["custom_id"] in _responses(100))
        assert sent == Counter({(URLS[n % 4], f"m-{n}"): 1 for n in range(100)})
        # a line answered directly needs no item row: only the background ones have a provider id to find
        store = Runtime.from_session(boto3.Session()).store
        rows = [row for shard in range(len(run.summary["shards"])) for row in store.items(run.job_id, shard)]
        assert {r.custom_id for r in rows} == _responses(100) and all(r.provider_id for r in rows)
    if mode == "batch":
        # the Batch API takes one endpoint per batch: one batch per endpoint and shard
        assert not sent
        creates = [e for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/batches"]
        assert len(creates) == 3 * len(URLS)


def _responses(count: int) -> set[str]:
    return {f"m-{n}" for n in range(count) if URLS[n % len(URLS)] == "/v1/responses"}


def with_bad_lines(path: Path, good: int, bad: int) -> Path:
    lines = [request_line(f"g-{n}") for n in range(good)] + [b"{not json %d\n" % n for n in range(bad)]
    return write_jsonl(path, lines)


def test_failed_lines_past_the_threshold_end_the_job_completed_with_errors(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud()
    queue = watch_events(cloud)
    run = run_job(cloud, with_bad_lines(tmp_path / "some-bad.jsonl", good=48, bad=2))

    # the execution ran to its end; the job says that lines were lost, everywhere it is read
    assert run.status == "SUCCEEDED"
    assert run.summary["status"] == "COMPLETED_WITH_ERRORS"
    assert run.summary["error_rate"] == pytest.approx(0.04) and run.summary["max_error_rate"] == 0
    assert len(run.results) == 48 and len(run.errors) == 2
    job = cloud.job(run.job_id)
    assert job is not None and job.job.status == "COMPLETED_WITH_ERRORS"
    [event] = received(queue)
    assert event["detail-type"] == "Sluice Job Completed With Errors"
    assert event["detail"]["status"] == "COMPLETED_WITH_ERRORS"
    assert event["detail"]["counts"]["errors"] == 2 and event["detail"]["error_rate"] == pytest.approx(0.04)


def test_failed_lines_within_the_jobs_max_error_rate_succeed(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud()
    queue = watch_events(cloud)
    path = with_bad_lines(tmp_path / "allowed.jsonl", good=48, bad=2)
    run = run_job(cloud, path, metadata={"sluice-max-error-rate": "0.04"})

    assert run.summary["status"] == "SUCCEEDED" and run.summary["max_error_rate"] == 0.04
    job = cloud.job(run.job_id)
    assert job is not None and job.job.status == "SUCCEEDED"
    [event] = received(queue)
    assert event["detail-type"] == "Sluice Job Completed" and event["detail"]["status"] == "SUCCEEDED"


def test_the_environments_max_error_rate_is_the_default(
    make_cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud = make_cloud()
    monkeypatch.setenv("SLUICE_MAX_ERROR_RATE", "0.05")
    run = run_job(cloud, with_bad_lines(tmp_path / "env.jsonl", good=48, bad=2))
    assert run.summary["status"] == "SUCCEEDED" and run.summary["max_error_rate"] == 0.05
    # a job's own setting wins over the environment's
    strict = run_job(
        cloud, with_bad_lines(tmp_path / "strict.jsonl", good=48, bad=2), metadata={"sluice-max-error-rate": "0"}
    )
    assert strict.summary["status"] == "COMPLETED_WITH_ERRORS"


def test_a_bad_max_error_rate_fails_the_job_naming_it(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud()
    run = run_job(
        cloud, with_bad_lines(tmp_path / "bad-rate.jsonl", good=5, bad=0), metadata={"sluice-max-error-rate": "5%"}
    )
    assert run.summary["status"] == "FAILED"
    assert "sluice-max-error-rate='5%'" in run.summary["error"]
