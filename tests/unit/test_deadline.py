"""A job's deadline (issue 44): reading it, and the pure plan of batch, flex and direct per shard."""

from __future__ import annotations

from pathlib import Path

import pytest
from sluice.contract import Settings
from sluice.plan.deadline import (
    DEFAULT_TURNAROUND_S,
    FLEX_FALLBACK_SHARE,
    FLEX_SLOWDOWN,
    Choice,
    DeadlineError,
    DeadlineRefused,
    expected_turnaround,
    flex_key_share,
    has_flex,
    parse_deadline,
    parse_duration,
)
from sluice.plan.deadline_choice import DeadlineInputs, KeyLimits, ShardLoad, plan_deadline
from sluice.plan.deadline_plan import deadline_inputs
from sluice.plan.job_options import JobOptions, PlanError

NOW = 1_750_000_000.0
SETTINGS = Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="a")


def test_durations_and_iso_times() -> None:
    assert parse_duration("6h") == 6 * 3600
    assert parse_duration("90m") == 5400
    assert parse_duration("2d") == 172_800
    assert parse_duration("1h30m") == 5400
    assert parse_duration("soon") is None
    assert parse_deadline("6h", now=NOW) == NOW + 6 * 3600
    assert parse_deadline("2025-06-15T17:06:40+00:00", now=NOW) == 1_750_007_200.0
    assert parse_deadline("2025-06-15T17:06:40Z", now=NOW) == 1_750_007_200.0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("2020-01-01T00:00:00Z", "in the past"),
        ("tomorrow", "neither a duration"),
        ("2025-06-15T18:00:00", "no time zone"),
        ("0h", "more than nothing"),
    ],
)
def test_bad_deadlines_name_the_problem(text: str, problem: str) -> None:
    with pytest.raises(DeadlineError, match=problem):
        parse_deadline(text, now=NOW)


def test_metadata_deadline_makes_the_job_auto_and_checks_its_options() -> None:
    options = JobOptions.from_metadata({"sluice-deadline": "6h"}, SETTINGS, uploaded_at=NOW + 10**9)
    assert options.mode == "auto"
    assert options.deadline is not None and options.deadline.at == NOW + 10**9 + 6 * 3600
    assert options.on_batch_incomplete == "direct"
    with pytest.raises(PlanError, match="in the past"):
        JobOptions.from_metadata({"sluice-deadline": "2020-01-01T00:00:00Z"}, SETTINGS)
    with pytest.raises(PlanError, match="neither a duration"):
        JobOptions.from_metadata({"sluice-deadline": "by nine"}, SETTINGS)
    with pytest.raises(PlanError, match="no sluice-mode=direct"):
        JobOptions.from_metadata({"sluice-deadline": "6h", "sluice-mode": "direct"}, SETTINGS)
    with pytest.raises(PlanError, match="on-batch-incomplete=error"):
        JobOptions.from_metadata({"sluice-deadline": "6h", "sluice-on-batch-incomplete": "error"}, SETTINGS)
    with pytest.raises(PlanError, match="batch-turnaround"):
        JobOptions.from_metadata({"sluice-deadline": "6h", "sluice-batch-turnaround": "fast"}, SETTINGS)


def test_a_family_without_batch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import sluice.plan.job_options as job_options

    monkeypatch.setattr(job_options, "modes", lambda _name: frozenset({"direct"}))
    with pytest.raises(PlanError, match="has no Batch API"):
        JobOptions.from_metadata({"sluice-deadline": "6h"}, SETTINGS)


def _loads(shards: int, requests: int = 1000, model: str = "gpt-4o-mini") -> list[ShardLoad]:
    return [ShardLoad(n, requests, requests * 100, requests * 50, model) for n in range(shards)]


def _inputs(window_s: float, *, rpm: float = 6000, turnaround_s: float = 600, cancel_s: float = 60) -> DeadlineInputs:
    return DeadlineInputs(
        now=NOW,
        deadline=NOW + window_s,
        key=KeyLimits(rpm=rpm),
        family="openai",
        turnaround_s=turnaround_s,
        turnaround_source="test",
        cancel_s=cancel_s,
    )


def test_a_deadline_the_batch_meets_is_all_batch_at_half_price() -> None:
    # 4,000 requests at 100 a second: 42 s direct; a 10-minute batch, a day to go
    plan = plan_deadline(_loads(4), _inputs(86_400))
    assert set(plan.choices().values()) == {Choice.BATCH}
    all_direct = plan.total("all_direct_usd")
    assert all_direct is not None
    assert plan.total("cost_usd") == pytest.approx(all_direct / 2)
    assert plan.total("all_batch_usd") == plan.total("cost_usd")
    assert plan.cutover_at is not None and plan.cutover_at < plan.deadline
    # the cutover leaves time to cancel and send every batch line directly
    assert plan.deadline - plan.cutover_at >= 60 + 4000 / 100


def test_a_tight_deadline_batches_what_the_fallback_can_cover() -> None:
    # 10 shards of 1,000 at 100 a second (105 s direct); 600 s batch, 60 s to cancel, 700 s to go:
    # the batch shards' fallback must fit in 700 - 60 - 600 = 40 s: three shards' (31.5 s)
    plan = plan_deadline(_loads(10), _inputs(700))
    choices = list(plan.choices().values())
    assert choices.count(Choice.BATCH) == 3
    assert plan.total("cost_usd") < plan.total("all_direct_usd")  # type: ignore[operator]
    assert plan.finish_at <= plan.deadline
    assert plan.cutover_at is not None and plan.cutover_at >= NOW + 600


def test_no_time_for_a_batch_is_all_direct_with_the_reason() -> None:
    plan = plan_deadline(_loads(3), _inputs(200))
    assert set(plan.choices().values()) == {Choice.DIRECT}
    assert plan.cutover_at is None
    assert "too little time" in plan.shards[0].why
    assert plan.total("cost_usd") == plan.total("all_direct_usd")


def test_flex_where_the_model_has_it_and_time_allows() -> None:
    assert has_flex("o4-mini") and has_flex("gpt-5-mini-2025-08-07") and not has_flex("gpt-4o-mini")
    plan = plan_deadline(_loads(3, model="o4-mini"), _inputs(200))
    assert set(plan.choices().values()) == {Choice.FLEX}
    assert plan.total("cost_usd") == pytest.approx(plan.total("all_batch_usd"))  # flex: batch prices


def test_the_flex_models_are_a_default_a_job_extends() -> None:
    assert has_flex("gpt-5.4") and has_flex("gpt-5.5") and not has_flex("my-flex-model")
    options = JobOptions.from_metadata(
        {"sluice-deadline": "6h", "sluice-flex-models": "my-flex-model, gpt-4.1-mini"}, SETTINGS
    )
    assert options.flex_models == ("my-flex-model", "gpt-4.1-mini")
    inputs = deadline_inputs(options, SETTINGS, now=NOW, model="gpt-4.1-mini")
    assert set(inputs.flex_models) >= {"o3", "gpt-5.5", "my-flex-model", "gpt-4.1-mini"}
    # no time for a batch: what the job names goes at flex, what it does not, direct
    extended = DeadlineInputs(**{**_inputs(200).__dict__, "flex_models": inputs.flex_models})
    assert set(plan_deadline(_loads(3, model="gpt-4.1-mini"), extended).choices().values()) == {Choice.FLEX}
    assert set(plan_deadline(_loads(3, model="gpt-4.1-mini"), _inputs(200)).choices().values()) == {Choice.DIRECT}
    with pytest.raises(PlanError, match="with sluice-deadline only"):
        JobOptions.from_metadata({"sluice-flex-models": "m"}, SETTINGS)


def test_flex_time_allows_for_lines_that_go_on_at_the_standard_tier() -> None:
    # flex answers at twice a direct request's share of the key, and a quarter of its lines take two
    # answers without capacity and a standard request more
    assert flex_key_share() == pytest.approx(FLEX_SLOWDOWN + FLEX_FALLBACK_SHARE * 3) == 2.75
    # 3,000 requests at 100 a second: 31.5 s direct, 86.6 s at flex with its fallbacks
    assert set(plan_deadline(_loads(3, model="o4-mini"), _inputs(90)).choices().values()) == {Choice.FLEX}
    assert Choice.DIRECT in plan_deadline(_loads(3, model="o4-mini"), _inputs(80)).choices().values()


def test_an_impossible_deadline_is_refused_with_the_earliest_finish() -> None:
    with pytest.raises(DeadlineRefused, match="cannot be met") as caught:
        plan_deadline(_loads(10), _inputs(60))
    assert caught.value.earliest_finish == pytest.approx(NOW + 10_000 / 100 * 1.05)
    assert "earliest finish" in str(caught.value)


def test_the_batch_queue_limits_what_batches() -> None:
    inputs = DeadlineInputs(**{**_inputs(86_400).__dict__, "queue_tokens": 250_000})
    choices = list(plan_deadline(_loads(4), inputs).choices().values())
    assert choices.count(Choice.BATCH) == 2  # 100,000 input tokens a shard


def test_turnaround_measured_else_the_family_default() -> None:
    at, source = expected_turnaround("anthropic")
    assert at == DEFAULT_TURNAROUND_S["anthropic"] and "default" in source
    at, source = expected_turnaround("openai", [60.0] * 9 + [600.0])
    assert at == 60.0 and "10 earlier batches" in source
    at, _ = expected_turnaround("openai", [60.0] * 8 + [600.0] * 2)
    assert at == 600.0


def test_past_the_cutover_a_batch_shard_looks_again_soon_enough_to_keep_the_margin() -> None:
    from sluice.runners.batch.cutover import until_cutover

    # before the cutover: woken at it
    assert until_cutover(14, cutover_at=105.0, now=100.0, cancel_s=10.0, floor_s=1) == 5
    # past it: a tenth of the cancel's time, not the 14 s a wait grown with the time waited asks
    assert until_cutover(14, cutover_at=100.0, now=101.0, cancel_s=10.0, floor_s=1) == 1
    assert until_cutover(300, cutover_at=100.0, now=101.0, cancel_s=600.0, floor_s=10) == 60
    # no deadline: the wait as it was
    assert until_cutover(14, cutover_at=None, now=101.0, cancel_s=10.0, floor_s=1) == 14


def test_sluice_run_and_estimate_take_the_flex_models() -> None:
    from sluice_local.cli.parser import build_parser
    from sluice_local.cli.run import _job_metadata

    args = build_parser().parse_args(["run", "in.jsonl", "--deadline", "1h", "--flex-models", "my-flex-model"])
    assert _job_metadata(args)["sluice-flex-models"] == "my-flex-model"
    estimate = build_parser().parse_args(["estimate", "in.jsonl", "--deadline", "1h", "--flex-models", "a,b"])
    assert estimate.flex_models == "a,b"


def test_the_issues_example_meets_its_deadline_at_the_rates_shards_really_get() -> None:
    # 20 shards of 5,000 at 1,200 requests a minute shared by 20 running shards (1 a second each), a
    # 2 h deadline and a 1 h batch: the old plan batched 11 shards and a late one ended 35 min late
    inputs = DeadlineInputs(
        now=NOW,
        deadline=NOW + 7200,
        key=KeyLimits(rpm=1200),
        family="openai",
        turnaround_s=3600,
        turnaround_source="test",
        cancel_s=600,
        slots=20,
        running=20,
    )
    plan = plan_deadline(_loads(20, requests=5000), inputs)
    assert plan.shard_rate_per_s == pytest.approx(1.0)
    batch = [s for s in plan.shards if s.choice == Choice.BATCH]
    direct = [s for s in plan.shards if s.choice != Choice.BATCH]
    assert batch and plan.cutover_at is not None
    # until the cutover every shard sends at its share; after it the late shards share the whole key
    assert sum(s.cutover_share for s in batch) == pytest.approx(1.0)
    for s in direct:
        assert NOW + s.requests / plan.shard_rate_per_s <= plan.cutover_at
    # every batch late, its cancel handing back nothing: each shard's lines at its part of the key
    for s in batch:
        assert plan.cutover_at + 600 + s.requests / (plan.rate_per_s * s.cutover_share) <= plan.deadline
        assert plan.cutover_at >= NOW + 3600
    assert plan.finish_at <= plan.deadline


def test_a_deadline_the_shares_cannot_meet_is_refused_with_the_finish_they_give() -> None:
    # 2,000 requests at 100 a second is 21 s for the key, but one shard of 1,900 among two running
    # sends at 50 a second: 40 s
    loads = [ShardLoad(0, 1900, 190_000, 95_000, "gpt-4o-mini"), ShardLoad(1, 100, 10_000, 5_000, "gpt-4o-mini")]
    with pytest.raises(DeadlineRefused) as caught:
        plan_deadline(loads, _inputs(30))
    assert caught.value.earliest_finish == pytest.approx(NOW + 1900 / 50 * 1.05)


def test_batch_shards_hold_their_slots_and_the_family_counts_its_jobs() -> None:
    base = _inputs(3000, rpm=6000, turnaround_s=600).__dict__
    # two slots for 6 shards: a batch shard holds its slot, so the direct ones queue in the other
    few_slots = plan_deadline(_loads(6), DeadlineInputs(**{**base, "slots": 2, "running": 2}))
    assert list(few_slots.choices().values()).count(Choice.BATCH) <= 1
    assert few_slots.finish_at <= few_slots.deadline
    # Bedrock's jobs a model: two at once, one a shard
    quota = plan_deadline(_loads(6), DeadlineInputs(**{**base, "max_batch_jobs": 2, "batch_records": 50_000}))
    shards = quota.shards
    assert [s.choice for s in shards].count(Choice.BATCH) == 2
    assert "2 batch jobs of a model at once" in shards[2].why


def test_past_the_cutover_a_late_batch_shard_takes_its_part_of_the_jobs_whole_rate() -> None:
    from dataclasses import replace

    from sluice.contract import ShardSpec
    from sluice.runners.batch.cutover import handed_over

    spec = ShardSpec(
        job_id="j", shard=0, bucket="b", key="k", etag="e", start=0, end=1, first_line=1, lines=5000,
        mode="batch", concurrency=5, max_attempts=3, running=20, rpm=60, tpm=0, job_rpm=1200,
        cutover_at=100.0, cutover_share=0.2,
    )  # fmt: skip
    # before the cutover: the equal share of the shards running
    assert handed_over(spec, 99.0) is spec
    late = handed_over(spec, 100.0)
    assert (late.rpm, late.concurrency) == (240.0, 20)
    # a direct shard, or a batch shard of a job with no deadline, keeps its share
    assert handed_over(replace(spec, mode="direct"), 100.0).rpm == 60
    assert handed_over(replace(spec, cutover_share=0.0), 100.0).rpm == 60


def test_batch_cancel_is_parsed_and_planned_with_by_run_submit_and_estimate(tmp_path: Path) -> None:
    from sluice.contract import LOCAL_SETTING_DEFAULTS
    from sluice.plan.deadline_plan import deadline_inputs

    from sluice_local.cli.estimate_deadline import deadline_plan, local_cancel_s
    from sluice_local.cli.parser import build_parser
    from sluice_local.cli.run import _job_metadata
    from sluice_local.deployed.submit import options_metadata
    from sluice_local.inputs import Estimate, FileCheck, ModelTotals

    flags = ["--deadline", "2h", "--rpm", "1200", "--batch-turnaround", "1h", "--batch-cancel", "15m"]
    # run: the job's metadata carries it, and Plan's inputs take it over the environment's 600 s
    metadata = _job_metadata(build_parser().parse_args(["run", "in.jsonl", *flags]))
    assert metadata["sluice-batch-cancel"] == "15m"
    options = JobOptions.from_metadata(metadata, SETTINGS)
    assert options.deadline is not None and options.deadline.batch_cancel_s == 900
    assert deadline_inputs(options, SETTINGS, now=NOW, model="gpt-4o-mini").cancel_s == 900
    without = JobOptions.from_metadata({"sluice-deadline": "2h"}, SETTINGS)
    assert deadline_inputs(without, SETTINGS, now=NOW, model=None).cancel_s == SETTINGS.batch_cancel_s
    # submit: as object metadata
    submitted = options_metadata(build_parser().parse_args(["submit", "in.jsonl", *flags]))
    assert submitted["sluice-batch-cancel"] == "15m"
    # estimate: the plan keeps the same margin, and without it the one `sluice run` would
    est = Estimate(
        check=FileCheck(path=tmp_path / "in.jsonl", requests=100_000),
        by_model={"gpt-4o-mini": ModelTotals(requests=100_000, tokens_in=10**7, tokens_out=3 * 10**7)},
        assumed_output_tokens=300,
        concurrency=100,
        latency_s=2.0,
        shard_lines=5000,
    )
    args = build_parser().parse_args(["estimate", "in.jsonl", "--shard-lines", "5000", *flags])
    plan = deadline_plan(args, est)
    assert plan.cancel_s == 900
    assert plan.shard_rate_per_s == pytest.approx(20 / LOCAL_SETTING_DEFAULTS["map_concurrency"])
    args = build_parser().parse_args(["estimate", "in.jsonl", *flags[:6]])
    assert deadline_plan(args, est).cancel_s == local_cancel_s("openai")
    with pytest.raises(PlanError, match="batch-cancel is read with"):
        JobOptions.from_metadata({"sluice-batch-cancel": "10m"}, SETTINGS)
    with pytest.raises(PlanError, match="expected a duration"):
        JobOptions.from_metadata({"sluice-deadline": "2h", "sluice-batch-cancel": "soon"}, SETTINGS)
