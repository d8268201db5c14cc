"""The spending cap through the whole workflow: the job stops within one request of its cap, every
line accounted for, and a retry with a higher budget sends only what was not sent."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from sluice.contract.model import Request
from sluice.formats.lines import parse_line
from sluice.limits.budget import worst_case_nano
from sluice.providers import OPENAI

from sluice_local.cloud import run_job
from sluice_local.deployed.retry import INPUT_ERROR_CODES, write_lines
from tests.conftest import request_line, write_jsonl
from tests.workflow.helpers.outcomes import received, watch_events

LINES = 240


def worst_case(raw: bytes, number: int, *, batch: bool = False) -> int:
    request = parse_line(raw, number)
    assert isinstance(request, Request)
    return worst_case_nano(request, OPENAI, batch=batch)


def line(i: int) -> bytes:
    body = {
        "model": "gpt-4o-mini",
        "max_tokens": 12,
        "messages": [{"role": "user", "content": f"Write a short note about item {i} of the catalogue, please."}],
    }
    return orjson.dumps({"custom_id": f"b-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + b"\n"


def test_the_budget_stops_the_job_within_one_request_of_its_cap_and_a_retry_finishes_it(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    rows = [line(i) for i in range(LINES)]
    path = write_jsonl(tmp_path / "capped.jsonl", rows)
    one_request = max(worst_case(r, n + 1) for n, r in enumerate(rows)) / 1e9
    cloud = make_cloud(shard_lines=60, concurrency=20, map_concurrency=4)

    # the reference leaves the response cache alone, or the capped run would be answered from it
    full = run_job(cloud, path, key="inbox/uncapped.jsonl", metadata={"sluice-cache": "off"})
    cost = full.summary["cost_estimate_usd"]["provider"]
    cap = round(cost / 2, 9)
    simulator.clear_log()
    queue = watch_events(cloud)

    run = run_job(cloud, path, metadata={"sluice-budget-usd": str(cap)})

    assert run.summary["status"] == "BUDGET_EXCEEDED"
    assert run.verify(path).ok
    [event] = received(queue)
    assert event["detail-type"] == "Sluice Job Budget Exceeded" and event["detail"]["status"] == "BUDGET_EXCEEDED"
    budget = run.summary["budget"]
    assert budget["cap_usd"] == cap
    assert cap - one_request <= budget["spent_usd"] <= cap
    # the shards' count of the spend is the summary's price of the answers
    assert abs(budget["spent_usd"] - run.summary["cost_estimate_usd"]["provider"]) < 1e-6
    assert {e["error"]["code"] for e in run.errors} == {"budget_exceeded"}
    assert budget["unsent_lines"] == len(run.errors) > 0
    assert len(run.results) + len(run.errors) == LINES
    job = cloud.job(run.job_id)
    assert job is not None and job.job.status == "BUDGET_EXCEEDED"

    # resume: the failed lines, copied the way `sluice retry` copies them, with a higher budget
    picked = {e["line"]: e["custom_id"] for e in run.errors if e["error"]["code"] not in INPUT_ERROR_CODES}
    retry_path = tmp_path / "capped.retry-1.jsonl"
    write_lines(iter([path.read_bytes()]), picked, retry_path)
    resumed = run_job(
        cloud,
        retry_path,
        key="inbox/capped.retry-1.jsonl",
        metadata={"sluice-budget-usd": str(cost * 2), "sluice-parent-job": run.job_id},
    )

    assert resumed.summary["status"] == "SUCCEEDED"
    answered = {r["custom_id"] for r in run.results} | {r["custom_id"] for r in resumed.results}
    assert answered == {f"b-{i}" for i in range(LINES)}
    sent = Counter(e["custom_id"] for e in simulator.log if e["method"] == "POST" and e["custom_id"])
    assert set(sent) == answered and set(sent.values()) == {1}


def test_a_budget_for_a_model_with_no_price_is_refused_before_anything_is_sent(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    body = {"model": "my-finetune", "messages": [{"role": "user", "content": "hi"}]}
    row = orjson.dumps({"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": body}) + b"\n"
    path = write_jsonl(tmp_path / "unpriced.jsonl", [row])
    cloud = make_cloud()
    simulator.clear_log()

    run = run_job(cloud, path, metadata={"sluice-budget-usd": "5"})

    assert run.summary["status"] == "FAILED"
    assert "'my-finetune' has none" in run.summary["error"]
    assert not [e for e in simulator.log if e["method"] == "POST"]


def test_a_batch_shard_creates_a_batch_only_once_its_worst_case_is_reserved(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    rows = [request_line(f"q-{n}") for n in range(120)]
    path = write_jsonl(tmp_path / "batched.jsonl", rows)
    # three shards, one batch each, at the Batch API's half price: the cap covers two of them
    part = sum(worst_case(r, n + 1, batch=True) for n, r in enumerate(rows[:40]))
    cap = 2.5 * part / 1e9
    cloud = make_cloud(shard_lines=40, batch_max_requests=40, map_concurrency=3)
    simulator.configure(batch_phase_s=0.05)
    simulator.clear_log()

    run = run_job(cloud, path, metadata={"sluice-mode": "batch", "sluice-budget-usd": str(cap)})

    assert run.summary["status"] == "BUDGET_EXCEEDED"
    assert run.verify(path).ok
    assert len(run.results) == 80
    assert len(run.errors) == 40 and {e["error"]["code"] for e in run.errors} == {"budget_exceeded"}
    creates = [e for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/batches"]
    assert len(creates) == 2
    # a batch's rows count at their worst case (their usage is not settled back)
    assert run.summary["budget"]["spent_usd"] == round(2 * part / 1e9, 9) <= cap


def test_a_background_job_stops_at_its_cap_and_accounts_for_every_line(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    rows = [request_line(f"r-{n}", url="/v1/responses") for n in range(60)]
    path = write_jsonl(tmp_path / "background.jsonl", rows)
    one = max(worst_case(r, n + 1) for n, r in enumerate(rows))
    cap = 20.5 * one / 1e9
    cloud = make_cloud(shard_lines=20, map_concurrency=3, concurrency=6)
    simulator.clear_log()

    run = run_job(cloud, path, metadata={"sluice-mode": "background", "sluice-budget-usd": str(cap)})

    assert run.summary["status"] == "BUDGET_EXCEEDED"
    assert run.verify(path).ok
    assert {e["error"]["code"] for e in run.errors} == {"budget_exceeded"}
    assert len(run.results) >= 20
    assert run.summary["budget"]["spent_usd"] <= cap
    sent = [e for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/responses"]
    assert len(sent) == len(run.results)
