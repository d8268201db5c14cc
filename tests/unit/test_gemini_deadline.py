"""A Gemini job with a deadline: Plan asks the family for its flex models and its batch turnaround,
and picks batch where the deadline allows, then Gemini's flex tier, then direct."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from sluice.contract import Settings
from sluice.core.costs import price_per_million
from sluice.plan.deadline import Choice
from sluice.plan.deadline_choice import KeyLimits, ShardLoad, plan_deadline
from sluice.plan.deadline_plan import deadline_inputs
from sluice.plan.job_options import JobOptions

# a deadline is read against the clock: the job is uploaded now
NOW = time.time()
MODEL = "gemini-2.5-flash"
SETTINGS = Settings(
    bucket="b", table="t", provider="gemini", provider_base_url="http://x", api_key_secret_arn="a", default_model=MODEL
)


def _loads(shards: int = 3, requests: int = 1000, model: str = MODEL) -> list[ShardLoad]:
    return [ShardLoad(n, requests, requests * 100, requests * 50, model) for n in range(shards)]


def _inputs(window_s: float, model: str = MODEL) -> object:
    options = JobOptions.from_metadata({"sluice-deadline": "6h"}, SETTINGS, uploaded_at=NOW)
    inputs = deadline_inputs(options, SETTINGS, now=NOW, model=model, shards=3)
    # 100 requests a second, a 10-minute batch, a minute to cancel one
    # and a queue that holds the job (the environment says its model's Batch queue, as for OpenAI)
    return replace(
        inputs, deadline=NOW + window_s, key=KeyLimits(rpm=6000), turnaround_s=600.0, cancel_s=60.0, queue_tokens=0
    )


def test_a_gemini_deadline_job_plans_with_the_familys_flex_and_turnaround() -> None:
    options = JobOptions.from_metadata({"sluice-deadline": "6h"}, SETTINGS, uploaded_at=NOW)
    inputs = deadline_inputs(options, SETTINGS, now=NOW, model=MODEL, shards=3)
    assert inputs.family == "gemini"
    assert inputs.batch and inputs.flex
    assert MODEL in inputs.flex_models and "gpt-5" not in inputs.flex_models
    assert inputs.turnaround_s == 6 * 3600.0
    assert "gemini default" in inputs.turnaround_source
    price = price_per_million(MODEL)
    assert price is not None and (price.input, price.output) == (0.30, 2.50)


@pytest.mark.parametrize(
    ("window_s", "chosen"),
    [
        # a day: every shard a batch, at half price
        (86_400, Choice.BATCH),
        # 200 s: no time for a 600 s batch, time for flex (about 87 s with its fallbacks)
        (200, Choice.FLEX),
        # 60 s: flex too slow, direct (about 32 s) in time
        (60, Choice.DIRECT),
    ],
)
def test_a_gemini_deadline_job_chooses_batch_then_flex_then_direct(window_s: float, chosen: str) -> None:
    plan = plan_deadline(_loads(), _inputs(window_s))  # type: ignore[arg-type]
    assert set(plan.choices().values()) == {chosen}
    assert plan.finish_at <= plan.deadline
    direct = plan.total("all_direct_usd")
    assert direct is not None
    half = direct / 2
    assert plan.total("cost_usd") == pytest.approx(direct if chosen == Choice.DIRECT else half)


def test_a_gemini_model_without_flex_goes_direct_when_a_batch_cannot_make_it() -> None:
    plan = plan_deadline(_loads(model="gemini-2.0-flash"), _inputs(200, "gemini-2.0-flash"))  # type: ignore[arg-type]
    assert set(plan.choices().values()) == {Choice.DIRECT}
