"""Background shards wake on signed webhooks; losing or repeating them changes nothing but time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sluice_local.cloud import run_job
from tests.conftest import request_line, write_jsonl

LINES = 60


def answers(run: Any) -> list[tuple[str, str, str]]:
    """What a user compares between runs: id, how it settled, what it said."""
    rows = []
    for record in run.results:
        body = record["response"]["body"]
        text = body["output"][0]["content"][0]["text"]
        rows.append((record["custom_id"], body["status"], text))
    return rows


def run_background(
    make_cloud: Any, simulator: Any, tmp_path: Path, *, poll_seconds: int, name: str = "hooks", **webhooks: Any
) -> tuple[Any, float, Any]:
    cloud = make_cloud(shard_lines=30, concurrency=20, poll_seconds=poll_seconds)
    return (*run_on(cloud, simulator, tmp_path, name=name, **webhooks),)


def run_on(cloud: Any, simulator: Any, tmp_path: Path, *, name: str, **webhooks: Any) -> tuple[Any, float, Any]:
    simulator.configure(
        latency_s=0.3,
        incomplete_rate=0.2,
        webhook_url=cloud.webhook_url,
        webhook_secret=cloud.webhook_secret,
        **webhooks,
    )
    path = write_jsonl(tmp_path / f"{name}.jsonl", [request_line(f"w-{n}", url="/v1/responses") for n in range(LINES)])
    started = time.monotonic()
    # without the response cache: a second run here must be answered by the provider again
    run = run_job(cloud, path, metadata={"sluice-mode": "background", "sluice-cache": "off"})
    return run, time.monotonic() - started, cloud


def test_shards_wake_on_webhooks_long_before_the_polling_interval(make_cloud, simulator, tmp_path: Path) -> None:
    run, seconds, cloud = run_background(make_cloud, simulator, tmp_path, poll_seconds=60)
    assert run.status == "SUCCEEDED"
    assert len(run.results) == LINES
    # the wait times out only after 60 s: finishing far sooner means webhooks woke every shard
    assert seconds < 30, f"took {seconds:.1f} s; a 60 s poll interval means the webhooks did not wake the shards"
    accepted = [w for w in simulator.webhooks if w["type"].startswith("response.") and w["deliveries"]]
    assert len(accepted) >= LINES
    # one Collect per shard, or a second when a shard was woken while a late item was still out
    assert 2 <= sum(1 for i in cloud.invocations if i.step == "collect") <= 4


def test_with_every_webhook_lost_the_job_finishes_by_polling_with_the_same_results(
    make_cloud, simulator, tmp_path: Path
) -> None:
    run, _, cloud = run_background(make_cloud, simulator, tmp_path, poll_seconds=2, webhook_drop_rate=1.0)
    assert run.status == "SUCCEEDED"
    assert run.summary["counts"]["results"] == LINES
    assert all(w["dropped"] and not w["deliveries"] for w in simulator.webhooks)
    simulator.reset()  # the same attempt numbers, so the same deterministic answers
    baseline, _, _ = run_on(cloud, simulator, tmp_path, name="baseline", webhook_drop_rate=0.0)
    assert answers(run) == answers(baseline)


def test_duplicated_delayed_and_reordered_webhooks_change_no_count(make_cloud, simulator, tmp_path: Path) -> None:
    run, _, cloud = run_background(
        make_cloud,
        simulator,
        tmp_path,
        poll_seconds=60,
        webhook_duplicate_rate=1.0,
        webhook_delay_s=0.05,
        webhook_jitter_s=1.0,
    )
    delivered = sorted(
        (d["t"], h["t"]) for h in simulator.webhooks for d in h["deliveries"] if d.get("t") and d.get("copy") == 0
    )
    emitted_order = [emitted for _, emitted in delivered]
    assert emitted_order != sorted(emitted_order), "the deliveries should arrive out of order"
    assert run.status == "SUCCEEDED"
    assert run.summary["counts"] == {"lines": LINES, "blank": 0, "requests": LINES, "results": LINES, "errors": 0}
    job = cloud.job(run.job_id)
    assert job is not None and (job.done, job.failed) == (LINES, 0)
    ids = [r["custom_id"] for r in run.results]
    assert ids == [f"w-{n}" for n in range(LINES)]
