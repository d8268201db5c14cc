"""A job with a deadline (issue 44) end to end: the plan per shard, a batch cancelled at its cutover
with its answers kept and the rest sent direct, a deadline the batch meets, one only flex meets, and
one refused."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import orjson

from sluice_local.cloud import run_job
from tests.conftest import write_jsonl
from tests.workflow.helpers.batch import lines, returned_by_batches, sent_directly


def answered(simulator) -> Counter[str]:  # type: ignore[no-untyped-def]
    """Each custom_id the provider answered, by batch or direct, with how many times."""
    direct = Counter(
        e["custom_id"]
        for e in simulator.log
        if e["method"] == "POST" and e["path"] == "/v1/chat/completions" and e["status"] == 200
    )
    return direct + returned_by_batches(simulator)


def test_a_batch_that_would_miss_the_deadline_is_cancelled_and_the_rest_sent_direct(
    make_cloud, simulator, tmp_path: Path
) -> None:
    # 400 lines at 100 a second (4.2 s direct). The job expects a 2 s batch; the simulator's takes
    # 24 s (8 s a phase, and 8 s to cancel): the plan batches all four shards, cancels at the cutover
    # (deadline - 14 s for the cancel, a poll, the collect and Merge - 4.2 s), and sends what the
    # batches left directly.
    cloud = make_cloud(shard_lines=100, map_concurrency=4, batch_cancel_s=14.0)
    simulator.configure(batch_phase_s=8.0)
    started = time.time()
    run = run_job(
        cloud,
        write_jsonl(tmp_path / "late.jsonl", lines(400)),
        metadata={"sluice-deadline": "34s", "sluice-rpm": "6000", "sluice-batch-turnaround": "2s"},
    )
    finished = time.time()
    assert run.status == "SUCCEEDED"
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(400)] and run.errors == []
    from sluice.contract import deadline_plan_key

    plan = cloud.read(deadline_plan_key(run.job_id)).decode()[:600]
    shards = [plan, [(s["batch"]["batches"], s["batch"]["direct_fallback_lines"]) for s in run.summary["shards"]]]
    assert finished < started + 34, f"ended {finished - started - 34:.1f} s after the deadline: {shards}"
    by_batch, direct = returned_by_batches(simulator), sent_directly(simulator)
    assert by_batch and direct, (len(by_batch), len(direct))
    # nothing paid twice: no custom_id answered by both, or twice by either
    assert max(answered(simulator).values()) == 1
    assert not set(by_batch) & set(direct)
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider_all_batch"] < costs["provider"] < costs["provider_all_direct"]
    # the summary says what was chosen for each shard and why, and that the deadline held
    deadline = run.summary["deadline"]
    assert deadline["met"] is True and deadline["shards_by_choice"] == {"batch": 4}
    assert deadline["batch_turnaround_source"] == "the job's sluice-batch-turnaround"
    assert deadline["as_run_usd"] == costs["provider"] and deadline["all_direct_usd"] == costs["provider_all_direct"]
    assert all(s["choice"] == "batch" and "cutover" in s["why"] for s in run.summary["shards"])


def test_a_deadline_the_batch_meets_is_all_batch_at_half_price(make_cloud, simulator, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=100, batch_cancel_s=2.0)
    simulator.configure(batch_phase_s=0.2)
    run = run_job(
        cloud,
        write_jsonl(tmp_path / "easy.jsonl", lines(300)),
        metadata={"sluice-deadline": "10m", "sluice-rpm": "6000", "sluice-batch-turnaround": "5s"},
    )
    assert run.status == "SUCCEEDED" and len(run.results) == 300
    assert not sent_directly(simulator)
    assert [s["mode"] for s in run.summary["shards"]] == ["batch"] * 3
    assert run.summary["deadline"]["shards_by_choice"] == {"batch": 3} and run.summary["deadline"]["met"]
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider"] == costs["provider_all_batch"]
    assert abs(costs["provider"] * 2 - costs["provider_all_direct"]) < 1e-5


def test_a_deadline_only_flex_meets_sends_every_line_at_flex_at_batch_prices(
    make_cloud, simulator, tmp_path: Path
) -> None:
    # a batch takes an hour and the deadline is ten minutes off; gpt-5-mini has flex, which sends at
    # the key's rate (slower) and is billed at batch prices: every shard goes direct at flex
    cloud = make_cloud(shard_lines=100)
    flex_lines = [line.replace(b'"gpt-4o-mini"', b'"gpt-5-mini"') for line in lines(300)]
    run = run_job(
        cloud,
        write_jsonl(tmp_path / "flex.jsonl", flex_lines),
        metadata={"sluice-deadline": "10m", "sluice-rpm": "6000", "sluice-batch-turnaround": "1h"},
    )
    assert run.status == "SUCCEEDED"
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(300)] and run.errors == []
    from sluice.contract import deadline_plan_key

    plan = orjson.loads(cloud.read(deadline_plan_key(run.job_id)))
    assert [s["choice"] for s in plan["shards"]] == ["flex"] * 3
    assert [s["mode"] for s in run.summary["shards"]] == ["direct"] * 3
    sent = [e for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/chat/completions"]
    assert len(sent) >= 300 and {e["service_tier"] for e in sent} == {"flex"}
    assert not returned_by_batches(simulator)
    assert {r["response"]["body"]["service_tier"] for r in run.results} == {"flex"}
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider"] == costs["provider_all_batch"]
    assert abs(costs["provider"] * 2 - costs["provider_all_direct"]) < 1e-5


def test_a_flex_line_flex_has_no_capacity_for_goes_on_at_the_standard_tier_at_list_price(
    make_cloud, simulator, tmp_path: Path
) -> None:
    # flex's bad day: half its requests answered 429 resource_unavailable. Each line goes on at the
    # standard tier after two of them, so every line is answered, and those lines are priced direct
    cloud = make_cloud(shard_lines=100)
    simulator.configure(flex_unavailable_rate=0.5)
    flex_lines = [line.replace(b'"gpt-4o-mini"', b'"gpt-5-mini"') for line in lines(300)]
    run = run_job(
        cloud,
        write_jsonl(tmp_path / "busy.jsonl", flex_lines),
        metadata={"sluice-deadline": "10m", "sluice-rpm": "6000", "sluice-batch-turnaround": "1h"},
    )
    assert run.status == "SUCCEEDED"
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(300)] and run.errors == []
    assert [s["choice"] for s in run.summary["shards"]] == ["flex"] * 3
    served = Counter(r["response"]["body"]["service_tier"] for r in run.results)
    assert served["flex"] and served["default"], served
    assert run.summary["deadline"]["flex_fallback_lines"] == served["default"]
    # a line that fell back was asked at flex twice, each refused, then once at the standard tier
    sent = [e for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/chat/completions"]
    fell_back = {r["custom_id"] for r in run.results if r["response"]["body"]["service_tier"] == "default"}
    for custom_id in list(fell_back)[:20]:
        tiers = [(e["service_tier"], e["status"]) for e in sent if e["custom_id"] == custom_id]
        assert tiers == [("flex", 429), ("flex", 429), ("default", 200)], tiers
    # priced as flex (batch prices) where flex answered, at list price where the standard tier did
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider_all_batch"] < costs["provider"] < costs["provider_all_direct"]
    share = served["default"] / 300
    expected = costs["provider_all_batch"] * (1 + share)
    assert abs(costs["provider"] - expected) < expected * 0.05, (costs, share)


def test_a_model_that_refuses_flex_sends_its_shard_at_the_standard_tier(make_cloud, simulator, tmp_path: Path) -> None:
    # the user says gpt-4o-mini has flex; the provider says no (400 on service_tier): the shard is
    # sent at the standard tier, not to errors
    cloud = make_cloud(shard_lines=100)
    run = run_job(
        cloud,
        write_jsonl(tmp_path / "refused.jsonl", lines(200)),
        metadata={
            "sluice-deadline": "10m",
            "sluice-rpm": "6000",
            "sluice-batch-turnaround": "1h",
            "sluice-flex-models": "gpt-4o-mini",
        },
    )
    assert run.status == "SUCCEEDED"
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(200)] and run.errors == []
    assert [s["choice"] for s in run.summary["shards"]] == ["flex"] * 2
    assert {r["response"]["body"]["service_tier"] for r in run.results} == {"default"}
    assert run.summary["deadline"]["flex_fallback_lines"] == 200
    refused = [e for e in simulator.log if e["method"] == "POST" and e["status"] == 400]
    # each run learns it once a request in flight, not once a line
    assert 0 < len(refused) <= 2 * 50, len(refused)
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider"] == costs["provider_all_direct"]


def test_a_deadline_the_key_cannot_meet_is_refused_at_plan(make_cloud, simulator, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=100)
    run = run_job(
        cloud,
        write_jsonl(tmp_path / "rushed.jsonl", lines(300)),
        metadata={"sluice-deadline": "10s", "sluice-rpm": "60"},
    )
    # refused: the job FAILED, the execution not (a user's input pages nobody)
    assert run.summary["status"] == "FAILED" and run.status == "SUCCEEDED"
    assert "cannot be met" in run.summary["error"] and "earliest finish" in run.summary["error"]
    assert not sent_directly(simulator) and not returned_by_batches(simulator)


def test_a_batch_jobs_measured_turnaround_is_what_the_next_deadline_job_plans_on(
    make_cloud, simulator, tmp_path: Path
) -> None:
    from sluice.contract import deadline_plan_key, turnarounds_key

    # the cache off: the second job's lines ask what the first's did, and would all be hits
    cloud = make_cloud(shard_lines=100, batch_cancel_s=2.0, cache="off")
    simulator.configure(batch_phase_s=0.2)
    first = run_job(cloud, write_jsonl(tmp_path / "first.jsonl", lines(100)), metadata={"sluice-mode": "batch"})
    assert first.status == "SUCCEEDED"
    assert [b["status"] for b in first.summary["shards"][0]["batch"]["batches"]] == ["completed"]
    key = turnarounds_key("openai", "gpt-4o-mini")
    [measured] = orjson.loads(cloud.read(key))["turnarounds_s"]

    # on the family's default (6 h) a 10-minute deadline sends everything direct; on the batch
    # measured (about a second here) it batches every shard
    second = run_job(
        cloud,
        write_jsonl(tmp_path / "second.jsonl", lines(200, prefix="r")),
        metadata={"sluice-deadline": "10m", "sluice-rpm": "6000"},
    )
    assert second.status == "SUCCEEDED" and len(second.results) == 200
    plan = orjson.loads(cloud.read(deadline_plan_key(second.job_id)))
    assert plan["batch_turnaround_source"].startswith("measured"), plan["batch_turnaround_source"]
    assert plan["batch_turnaround_s"] == round(measured, 1)
    assert [s["mode"] for s in second.summary["shards"]] == ["batch", "batch"]
    # and its own completed batches are kept after the first job's
    assert len(orjson.loads(cloud.read(key))["turnarounds_s"]) == 3


def test_late_batch_shards_among_many_running_whose_cancels_hand_back_nothing_meet_the_deadline(
    make_cloud, simulator, tmp_path: Path
) -> None:
    # The case, scaled 1:200 in time: 20 shards of 25 lines at 1,200 a minute shared by the
    # 20 running (1 a second each), a 40 s deadline, an 18 s batch expected and 8 s for a cancel. The
    # simulator's batches take 60 s, and a cancelled one hands back nothing. The old plan batched 10
    # shards and sent each late one at 1 a second after its cutover (ending about 45 s in); now the
    # plan batches the few its arithmetic holds, and at the cutover they take the whole key.
    cloud = make_cloud(shard_lines=25, map_concurrency=20, batch_cancel_s=8.0, cache="off")
    simulator.configure(batch_phase_s=20.0, batch_cancel_s=1.0, batch_cancel_answers="none")
    started = time.time()
    run = run_job(
        cloud,
        write_jsonl(tmp_path / "many.jsonl", lines(500)),
        metadata={"sluice-deadline": "40s", "sluice-rpm": "1200", "sluice-batch-turnaround": "18s"},
    )
    finished = time.time()
    assert run.status == "SUCCEEDED"
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(500)] and run.errors == []
    by_choice = run.summary["deadline"]["shards_by_choice"]
    assert 0 < by_choice["batch"] < by_choice["direct"], by_choice
    # every batch was late and handed back nothing: each of their lines went direct, once
    assert not returned_by_batches(simulator)
    assert max(answered(simulator).values()) == 1 and len(sent_directly(simulator)) == 500
    assert finished < started + 40, f"ended {finished - started - 40:.1f} s after the deadline: {by_choice}"
    assert run.summary["deadline"]["met"] is True
