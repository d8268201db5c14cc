from collections.abc import Callable
from dataclasses import asdict, replace
from types import SimpleNamespace

import boto3
import orjson
import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws
from sluice.contract import Settings, SettingsError
from sluice.formats.lines import split_lines
from sluice.merge.merge import outcome_status
from sluice.plan.plan import (
    JobOptions,
    PlanError,
    check_batch_models,
    check_budget_models,
    event_key_candidates,
    find_object,
    job_id_for,
    output_prefix,
    plan_lines,
)

from tests.conftest import request_line

SETTINGS = Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="arn")


def request(cid: str, pad: int = 0) -> bytes:
    body = {"model": "m", "input": "x" * pad}
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/responses", "body": body}) + b"\n"


@settings(max_examples=150, deadline=None)
@given(
    pads=st.lists(st.integers(min_value=0, max_value=300), min_size=0, max_size=60),
    shard_lines=st.integers(min_value=1, max_value=12),
    shard_bytes=st.integers(min_value=1, max_value=2000),
    chunk=st.integers(min_value=1, max_value=500),
    trailing_newline=st.booleans(),
)
def test_shards_are_line_aligned_ranges_that_cover_the_file(
    pads: list[int], shard_lines: int, shard_bytes: int, chunk: int, trailing_newline: bool
) -> None:
    data = b"".join(request(f"id-{i}", pad) for i, pad in enumerate(pads))
    if data and not trailing_newline:
        data = data[:-1]
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    result = plan_lines(split_lines(chunks), shard_lines=shard_lines, shard_bytes=shard_bytes)

    assert result.lines == len(pads)
    assert result.requests == len(pads)
    position, line = 0, 1
    rebuilt = []
    for shard in result.shards:
        assert shard.start == position
        assert shard.first_line == line
        assert 1 <= shard.lines <= shard_lines
        piece = data[shard.start : shard.end]
        # a range starts at a line start and ends after a newline (or at the end of the file)
        assert shard.start == 0 or data[shard.start - 1 : shard.start] == b"\n"
        assert piece.endswith(b"\n") or shard.end == len(data)
        assert piece.count(b"\n") + (0 if piece.endswith(b"\n") else 1) == shard.lines
        rebuilt.append(piece)
        position, line = shard.end, line + shard.lines
    assert b"".join(rebuilt) == data


def test_duplicates_are_found_across_shards_and_first_one_wins() -> None:
    lines = [request("a"), request("b"), request("a"), b"\n", request("b")]
    result = plan_lines(lines, shard_lines=2)
    dupes = {k: v for s in result.shards for k, v in s.duplicates.items()}
    assert dupes == {3: 1, 5: 2}
    assert result.requests == 2
    assert result.blank == 1
    assert result.invalid == {"duplicate_custom_id": 2}


def test_job_id_is_stable_per_object_version() -> None:
    a = job_id_for("bucket", "inbox/reviews.jsonl", '"abc"')
    assert a == job_id_for("bucket", "inbox/reviews.jsonl", "abc")
    assert a.startswith("reviews-")
    assert a != job_id_for("bucket", "inbox/reviews.jsonl", "abd")
    assert output_prefix("inbox/team/reviews.jsonl") == "outbox/team/reviews"


def test_a_job_runs_no_more_shards_at_once_than_the_environment_allows() -> None:
    capped = replace(SETTINGS, max_shards_in_flight=100)
    assert JobOptions.from_metadata({"sluice-map-concurrency": "500"}, capped).map_concurrency == 100
    assert JobOptions.from_metadata({"sluice-map-concurrency": "40"}, capped).map_concurrency == 40
    assert JobOptions.from_metadata({"sluice-map-concurrency": "500"}, SETTINGS).map_concurrency == 500


def test_options_from_object_metadata() -> None:
    options = JobOptions.from_metadata({"sluice-mode": "background", "sluice-concurrency": "50"}, SETTINGS)
    # max_attempts 0: as many as the job needs; a job's own is a hard cap
    assert (options.mode, options.concurrency, options.max_attempts) == ("background", 50, 0)
    assert JobOptions.from_metadata({"sluice-max-attempts": "4"}, SETTINGS).max_attempts == 4
    with pytest.raises(PlanError, match="sluice-concurrency='lots'"):
        JobOptions.from_metadata({"sluice-concurrency": "lots"}, SETTINGS)
    budgets = JobOptions.from_metadata({"sluice-rpm": "600", "sluice-tpm": "0"}, SETTINGS)
    assert (budgets.rpm, budgets.tpm) == (600, 0)
    with pytest.raises(PlanError, match="unknown option"):
        JobOptions.from_metadata({"sluice-colour": "red"}, SETTINGS)


def test_a_mode_the_provider_has_no_api_for_is_refused_at_plan() -> None:
    anthropic = replace(SETTINGS, provider="anthropic")
    expected = (
        "sluice-mode=background: the anthropic provider has no background responses Sluice can run; "
        "use one of direct, batch, auto"
    )
    with pytest.raises(PlanError, match=expected):
        JobOptions.from_metadata({"sluice-mode": "background"}, anthropic)
    with pytest.raises(PlanError, match=expected):
        JobOptions.from_metadata({}, replace(anthropic, default_mode="background"))
    assert JobOptions.from_metadata({"sluice-mode": "background"}, SETTINGS).mode == "background"
    assert JobOptions.from_metadata({"sluice-mode": "batch"}, anthropic).mode == "batch"


def test_a_job_may_name_only_the_provider_its_environment_is_configured_for() -> None:
    anthropic = replace(SETTINGS, provider="anthropic")
    assert JobOptions.from_metadata({"sluice-provider": "anthropic"}, anthropic).mode == "direct"
    assert JobOptions.from_metadata({"sluice-provider": "openai", "sluice-mode": "batch"}, SETTINGS).mode == "batch"
    with pytest.raises(PlanError, match="sluice-provider=openai: this environment is configured for the anthropic"):
        JobOptions.from_metadata({"sluice-provider": "openai"}, anthropic)
    with pytest.raises(PlanError, match="sluice-provider='mistral'; expected one of openai"):
        JobOptions.from_metadata({"sluice-provider": "mistral"}, SETTINGS)


def test_auto_batches_a_big_shard_of_a_provider_with_a_batch_api() -> None:
    anthropic = replace(SETTINGS, provider="anthropic")
    options = JobOptions.from_metadata({"sluice-mode": "auto"}, anthropic)
    big = SETTINGS.auto_batch_min_requests
    assert options.shard_mode(big, anthropic) == "batch"
    assert options.shard_mode(big - 1, anthropic) == "direct"
    assert options.shard_mode(big, SETTINGS) == "batch"


@pytest.mark.parametrize(("raw", "rate"), [("0", 0.0), ("0.001", 0.001), ("1", 1.0), ("1e-4", 0.0001)])
def test_max_error_rate_from_object_metadata(raw: str, rate: float) -> None:
    assert JobOptions.from_metadata({"sluice-max-error-rate": raw}, SETTINGS).max_error_rate == rate


@pytest.mark.parametrize("raw", ["1.5", "-0.1", "5%", "nan", ""])
def test_a_max_error_rate_outside_0_to_1_names_the_option(raw: str) -> None:
    with pytest.raises(PlanError, match=f"sluice-max-error-rate={raw!r}; expected a number from 0 to 1"):
        JobOptions.from_metadata({"sluice-max-error-rate": raw}, SETTINGS)


def test_the_max_error_rate_defaults_to_the_environments() -> None:
    assert JobOptions.from_metadata({}, SETTINGS).max_error_rate == 0.0
    env = {"SLUICE_BUCKET": "b", "SLUICE_TABLE": "t", "SLUICE_PROVIDER_BASE_URL": "u", "SLUICE_API_KEY_SECRET_ARN": "a"}
    lenient = Settings.from_env({**env, "SLUICE_MAX_ERROR_RATE": "0.02"})
    assert JobOptions.from_metadata({}, lenient).max_error_rate == 0.02
    with pytest.raises(SettingsError, match="SLUICE_MAX_ERROR_RATE='2'"):
        Settings.from_env({**env, "SLUICE_MAX_ERROR_RATE": "2"})


@pytest.mark.parametrize(
    ("errors", "requests", "rate", "status"),
    [
        (0, 100, 0.0, "SUCCEEDED"),
        (1, 50_000, 0.0, "COMPLETED_WITH_ERRORS"),
        (3, 50_000, 0.0001, "SUCCEEDED"),
        (5, 50_000, 0.0001, "SUCCEEDED"),
        (6, 50_000, 0.0001, "COMPLETED_WITH_ERRORS"),
        (50, 100, 0.5, "SUCCEEDED"),
        (51, 100, 0.5, "COMPLETED_WITH_ERRORS"),
        (29, 100, 0.29, "SUCCEEDED"),
        (100, 100, 1.0, "SUCCEEDED"),
        (0, 0, 0.0, "SUCCEEDED"),
    ],
)
def test_a_job_completes_with_errors_when_failed_lines_pass_its_max_error_rate(
    errors: int, requests: int, rate: float, status: str
) -> None:
    assert outcome_status(errors, requests, rate) == status


def test_a_run_stops_taking_items_once_its_shard_is_marked() -> None:
    from types import SimpleNamespace

    from sluice.shard.frame import CANCEL_CHECK_S, Stopper

    marks: dict[tuple[str, int], str] = {}
    reads: list[tuple[str, int]] = []

    def stop_mark(job_id: str, shard: int) -> str | None:
        reads.append((job_id, shard))
        return marks.get((job_id, shard))

    now = [0.0]
    ctx = SimpleNamespace(remaining_s=lambda: 900.0, settings=SETTINGS, store=SimpleNamespace(stop_mark=stop_mark))
    spec = SimpleNamespace(job_id="job", shard=3)
    stop = Stopper(ctx, spec, clock=lambda: now[0])  # type: ignore[arg-type]
    assert stop() is False
    marks[("job", 3)] = "FAILED"
    assert stop() is False  # looked at the shard's row when the run started, then every few seconds
    now[0] += CANCEL_CHECK_S
    assert stop() is True and stop.stopped == "FAILED"
    assert stop() is True
    # its own row, once a period
    assert reads == [("job", 3), ("job", 3)]
    out_of_time = Stopper(SimpleNamespace(remaining_s=lambda: 1.0, settings=SETTINGS, store=None), spec)  # type: ignore[arg-type]
    assert out_of_time() is True and out_of_time.stopped is None


def test_an_event_key_stands_for_itself_and_for_its_decoded_form() -> None:
    assert event_key_candidates("inbox/reviews.jsonl") == ["inbox/reviews.jsonl"]
    assert event_key_candidates("inbox/my+reviews.jsonl") == ["inbox/my+reviews.jsonl", "inbox/my reviews.jsonl"]
    assert event_key_candidates("inbox/c%2B%2B+K%C3%B6ln.jsonl") == [
        "inbox/c%2B%2B+K%C3%B6ln.jsonl",
        "inbox/c++ Köln.jsonl",
    ]


@mock_aws
def test_find_object_picks_the_candidate_whose_etag_matches() -> None:
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="inputs")
    plus = s3.put_object(Bucket="inputs", Key="inbox/a+b.jsonl", Body=b"plus\n")["ETag"]
    space = s3.put_object(Bucket="inputs", Key="inbox/a b.jsonl", Body=b"space\n")["ETag"]
    assert find_object(s3, "inputs", "inbox/a+b.jsonl", plus)[0] == "inbox/a+b.jsonl"
    assert find_object(s3, "inputs", "inbox/a+b.jsonl", space.strip('"'))[0] == "inbox/a b.jsonl"
    key, head = find_object(s3, "inputs", "inbox/a%20b.jsonl", space)
    assert key == "inbox/a b.jsonl" and head["ContentLength"] == 6
    with pytest.raises(ClientError) as missing:
        find_object(s3, "inputs", "inbox/other.jsonl", space)
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_a_budget_is_dollars_from_the_object_or_the_environment() -> None:
    assert JobOptions.from_metadata({"sluice-budget-usd": "12.5"}, SETTINGS).budget_usd == 12.5
    assert JobOptions.from_metadata({}, SETTINGS).budget_usd == 0.0
    assert JobOptions.from_metadata({}, replace(SETTINGS, budget_usd=3.0)).budget_usd == 3.0


@pytest.mark.parametrize("raw", ["0", "-2", "five", "nan", "inf", ""])
def test_a_bad_budget_names_the_option(raw: str) -> None:
    with pytest.raises(PlanError, match=r"sluice-budget-usd: .* is not an amount of US dollars above 0"):
        JobOptions.from_metadata({"sluice-budget-usd": raw}, SETTINGS)


def test_a_batch_job_none_of_whose_lines_a_batch_would_take_is_refused_at_plan() -> None:
    """Bedrock's batch jobs run Anthropic models only: a batch job of other models would send every
    line direct at list price, so it is refused; one model a batch runs is enough to go on."""
    bedrock = replace(SETTINGS, provider="bedrock")
    options = JobOptions.from_metadata({"sluice-mode": "batch"}, bedrock)
    with pytest.raises(PlanError, match=r"no line of the job can go by batch \(Bedrock batch inference runs"):
        check_batch_models(options, bedrock, {"gpt-4o-mini"})
    check_batch_models(options, bedrock, {"gpt-4o-mini", "anthropic.claude-3-haiku-20240307-v1:0"})
    forced = JobOptions.from_metadata(
        {"sluice-mode": "batch", "sluice-model": "us.anthropic.claude-3-5-haiku"}, bedrock
    )
    check_batch_models(forced, bedrock, set())
    # OpenAI's Batch API takes any model
    check_batch_models(JobOptions.from_metadata({"sluice-mode": "batch"}, SETTINGS), SETTINGS, {"my-finetune"})


def test_a_budget_needs_a_price_for_every_model_the_job_sends_to() -> None:
    options = JobOptions.from_metadata({"sluice-budget-usd": "5"}, SETTINGS)
    check_budget_models(options, SETTINGS, {"gpt-4o-mini", "gpt-4o-2024-08-06"})
    with pytest.raises(
        PlanError, match=r"'my-finetune' has none \(priced are the models genai-prices' data names.*price overrides"
    ):
        check_budget_models(options, SETTINGS, {"gpt-4o-mini", "my-finetune"})
    # a line with no model takes the environment's, and the job's model replaces every line's
    check_budget_models(options, replace(SETTINGS, default_model="gpt-4o"), {None})
    with pytest.raises(PlanError, match=r"\(no model\) has none"):
        check_budget_models(options, SETTINGS, {None})
    forced = JobOptions.from_metadata({"sluice-budget-usd": "5", "sluice-model": "gpt-4o"}, SETTINGS)
    check_budget_models(forced, SETTINGS, set())


def test_a_shard_the_cache_answers_whole_grows_until_a_miss_or_its_answers_fill_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sluice.plan.line_pass
    from sluice.plan.line_pass import cut_shards, read_lines

    monkeypatch.setattr(sluice.plan.line_pass, "MAX_ANSWERED_BYTES", 1000)
    table = read_lines([request(f"c-{i}") for i in range(40)], keys=SimpleNamespace(add=lambda request: None))

    def hits_but(*misses: int) -> Callable[[int], int | None]:
        return lambda line: None if line in misses else 50

    # lines 1-12 hit: a shard of 4 that never runs takes them all. Line 13 misses and starts a
    # shard that sends, which stops at 4 lines. Then hits again, until 1,000 bytes of answers.
    shards = cut_shards(table, shard_lines=4, answer=hits_but(13))
    assert [(s.first_line, s.lines) for s in shards] == [(1, 12), (13, 4), (17, 20), (37, 4)]
    # without the cache, or with no hits, shards keep their size
    assert {s.lines for s in cut_shards(table, shard_lines=4)} == {4}
    assert {s.lines for s in cut_shards(table, shard_lines=4, answer=hits_but(*range(1, 41)))} == {4}


def test_plan_holds_a_few_bytes_a_line_not_its_custom_id() -> None:
    import tracemalloc

    lines = [request(f"a-rather-long-custom-id-{n:012d}") for n in range(20_000)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = plan_lines(iter(lines), shard_lines=5000)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert result.requests == len(lines)
    # 10 million lines in well under half of Plan's memory: the ids alone took 142 bytes a line
    assert peak / len(lines) < 40


def test_plans_manifest_items_are_exactly_a_shard_spec_each(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.shard.frame import ShardSpec

    from tests.unit.helpers.cancel import BUCKET, Aws

    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        aws = Aws("http://127.0.0.1:9")
        aws.settings = replace(aws.settings, shard_lines=2, default_model="gpt-4o-mini", rpm=600, budget_usd=5.0)
        # a duplicate custom_id gives its shard a duplicates_key
        state = aws.plan("inbox/items.jsonl", [request_line(cid) for cid in ("a", "b", "c", "a", "d")])
        items = orjson.loads(aws.s3.get_object(Bucket=BUCKET, Key=state["manifest_key"])["Body"].read())

    assert len(items) == 3 and any(item["duplicates_key"] for item in items)
    # every key Plan writes is a field, and every field is written: read back, written again, the same
    assert [asdict(ShardSpec.from_dict(item)) for item in items] == items
