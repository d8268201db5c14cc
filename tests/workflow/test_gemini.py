"""A Gemini job end to end in the local cloud, on the simulator's Gemini API: a deadline job that
chooses batch (Gemini's Batch API), then flex (`service_tier: FLEX` on generateContent, billed at
batch prices, its no-capacity answers going on at the standard tier), then direct, each line
answered in input order."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from sluice_local.cloud import run_job
from tests.conftest import write_jsonl
from tests.workflow.helpers.gemini import batch_creates, gemini_lines, generated

# a model Sluice knows no flex tier for
PLAIN_MODEL = "gemini-2.0-flash"


def run_deadline(make_cloud: Any, tmp_path: Path, name: str, body_lines: list[bytes], **metadata: str) -> Any:
    cloud = make_cloud(provider="gemini", shard_lines=100, batch_cancel_s=2.0, poll_seconds=1)
    asked = {"sluice-rpm": "6000", **{f"sluice-{k.replace('_', '-')}": v for k, v in metadata.items()}}
    run = run_job(cloud, write_jsonl(tmp_path / f"{name}.jsonl", body_lines), metadata=asked)
    assert run.status == "SUCCEEDED", run.summary
    assert [r["custom_id"] for r in run.results] == [f"q-{n}" for n in range(len(body_lines))] and run.errors == []
    return run


def test_a_gemini_deadline_the_batch_meets_goes_by_the_batch_api_at_half_price(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    simulator.configure(batch_phase_s=0.2)
    run = run_deadline(make_cloud, tmp_path, "easy", gemini_lines(300), deadline="10m", batch_turnaround="5s")
    assert run.summary["deadline"]["shards_by_choice"] == {"batch": 3} and run.summary["deadline"]["met"]
    assert [s["mode"] for s in run.summary["shards"]] == ["batch"] * 3
    assert len(batch_creates(simulator)) == 3 and not generated(simulator)
    assert {r["response"]["body"]["object"] for r in run.results} == {"chat.completion"}
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider"] == costs["provider_all_batch"]
    assert abs(costs["provider"] * 2 - costs["provider_all_direct"]) < 1e-5


def test_a_gemini_deadline_only_flex_meets_sends_every_line_at_flex_at_batch_prices(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    simulator.configure(flex_unavailable_rate=0.0)
    run = run_deadline(make_cloud, tmp_path, "flex", gemini_lines(300), deadline="10m", batch_turnaround="1h")
    assert [s["choice"] for s in run.summary["shards"]] == ["flex"] * 3
    assert [s["mode"] for s in run.summary["shards"]] == ["direct"] * 3
    sent = generated(simulator)
    assert len(sent) == 300 and {e["service_tier"] for e in sent} == {"flex"}
    assert not batch_creates(simulator)
    assert {r["response"]["body"]["service_tier"] for r in run.results} == {"flex"}
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider"] == costs["provider_all_batch"]
    assert abs(costs["provider"] * 2 - costs["provider_all_direct"]) < 1e-5


def test_a_gemini_flex_line_without_capacity_goes_on_at_the_standard_tier_at_list_price(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    simulator.configure(flex_unavailable_rate=0.5)
    run = run_deadline(make_cloud, tmp_path, "busy", gemini_lines(300), deadline="10m", batch_turnaround="1h")
    assert [s["choice"] for s in run.summary["shards"]] == ["flex"] * 3
    served = Counter(r["response"]["body"].get("service_tier", "standard") for r in run.results)
    assert served["flex"] and served["standard"], served
    assert run.summary["deadline"]["flex_fallback_lines"] == served["standard"]
    fell_back = {r["custom_id"] for r in run.results if "service_tier" not in r["response"]["body"]}
    sent = generated(simulator)
    for custom_id in list(fell_back)[:20]:
        tiers = [(e["service_tier"], e["status"]) for e in sent if e["custom_id"] == custom_id]
        assert tiers == [("flex", 429), ("flex", 429), ("standard", 200)], tiers
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider_all_batch"] < costs["provider"] < costs["provider_all_direct"]


def test_a_gemini_deadline_with_no_time_for_a_batch_and_no_flex_goes_direct(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    run = run_deadline(
        make_cloud, tmp_path, "plain", gemini_lines(200, PLAIN_MODEL), deadline="10m", batch_turnaround="1h"
    )
    assert [s["choice"] for s in run.summary["shards"]] == ["direct"] * 2
    sent = generated(simulator)
    assert len(sent) >= 200 and {e["service_tier"] for e in sent} == {"standard"}
    costs = run.summary["cost_estimate_usd"]
    assert costs["provider"] == costs["provider_all_direct"]
