"""The last sweep in direct mode: a scripted provider, moto for the shard's parts and rows."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

import orjson
import pytest
from sluice.contract import Mode
from sluice.contract.model import ErrorCode, Outcome
from sluice.send.engine import make_session
from sluice.shard import sweep
from sluice.shard.frame import ShardContext
from sluice.shard.parts import part_keys, parts_stats, read_part
from sluice.shard.run import ShardRun
from sluice.shard.sweep import Timing, merged, split_attempts, sweep_concurrency, sweepable

from tests.unit.helpers.cancel import BUCKET, Aws
from tests.unit.helpers.engine import Action, Scripted, serve
from tests.unit.helpers.sweep import aws as aws
from tests.unit.helpers.sweep import run, shard

SERVER_ERROR: Action = ("status", 500, {}, {"error": {"message": "upstream failed", "type": "server_error"}})
THROTTLED: Action = ("status", 429, {"retry-after-ms": "1"}, {"error": {"message": "slow down"}})
BAD_REQUEST: Action = ("status", 400, {}, {"error": {"message": "no such model", "code": "model_not_found"}})


def sends(provider: Scripted) -> dict[str, int]:
    return dict(provider.attempts)


def shard_file(aws: Aws, key: str) -> dict[str, dict[str, Any]]:
    rows = aws.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().splitlines()
    return {row["custom_id"]: row for row in map(orjson.loads, rows)}


def test_a_line_that_exhausted_its_first_attempts_on_500s_ends_as_a_result_and_a_400_is_not_resent(aws: Aws) -> None:
    spec = shard(aws, ["ok-1", "flaky", "bad", "ok-2"])
    provider = Scripted(script={"flaky": [SERVER_ERROR] * 5, "bad": [BAD_REQUEST]})

    answer = run(aws, provider, spec)

    assert answer["done"]
    # three attempts in the first pass, the other three of its six in the last sweep
    assert sends(provider) == {"ok-1": 1, "flaky": 6, "bad": 1, "ok-2": 1}
    # the swept line went last: every other line was answered before its fourth attempt
    assert [e["cid"] for e in provider.log][-1] == "flaky"
    results = shard_file(aws, spec.results_key)
    errors = shard_file(aws, spec.errors_key)
    assert set(results) == {"ok-1", "flaky", "ok-2"}
    assert set(errors) == {"bad"} and errors["bad"]["error"]["code"] == ErrorCode.PROVIDER_ERROR
    stats = orjson.loads(aws.s3.get_object(Bucket=BUCKET, Key=spec.stats_key)["Body"].read())["stats"]
    assert stats["swept"] == 1 and stats["recovered_by_sweep"] == 1
    assert stats["attempts"] == 9 and stats["errors"] == {ErrorCode.PROVIDER_ERROR: 1}


def test_a_line_the_sweep_cannot_save_goes_to_errors_once_with_every_attempt_counted(aws: Aws) -> None:
    spec = replace(shard(aws, ["ok-1", "down"]), max_attempts=6)
    provider = Scripted(script={"down": [THROTTLED, SERVER_ERROR] * 10})

    run(aws, provider, spec)

    assert sends(provider) == {"ok-1": 1, "down": 6}
    errors = shard_file(aws, spec.errors_key)
    assert set(errors) == {"down"}
    error = errors["down"]["error"]
    assert error["code"] == ErrorCode.RETRIES_EXHAUSTED
    assert error["message"].startswith(
        "gave up after 6 attempts (3, then 3 in the shard's last sweep), the job's max-attempts of 6; last: HTTP 500"
    )
    stats = parts_stats(aws.s3, spec)
    assert (stats.swept, stats.recovered_by_sweep) == (1, 0)
    assert stats.attempts == 7 and stats.throttled == 3


@pytest.mark.parametrize(("max_attempts", "sent"), [(1, 1), (2, 2), (3, 3)])
def test_a_line_is_sent_at_most_max_attempts_times_last_sweep_included(aws: Aws, max_attempts: int, sent: int) -> None:
    spec = replace(shard(aws, ["ok-1", "down"]), max_attempts=max_attempts)
    provider = Scripted(script={"down": [SERVER_ERROR] * 10})

    run(aws, provider, spec)

    assert sends(provider) == {"ok-1": 1, "down": sent}
    (error,) = (e["error"] for e in shard_file(aws, spec.errors_key).values())
    assert error["message"].startswith(f"gave up after {sent} attempts")
    assert parts_stats(aws.s3, spec).attempts == 1 + sent


def test_a_run_out_of_time_before_the_sweep_leaves_the_line_pending_and_the_next_run_ends_it(aws: Aws) -> None:
    spec = shard(aws, ["ok-1", "flaky", "ok-2"])
    late = [False]
    provider = Scripted(script={"flaky": [SERVER_ERROR] * 6})
    provider.default = lambda _cid, _n: ("ok",)

    def remaining_s() -> float:
        # the Lambda's time runs out the moment the flaky line's first pass has ended
        late[0] = provider.attempts.get("flaky", 0) >= 3
        return 0.0 if late[0] else 900.0

    first = run(aws, provider, spec, remaining_s)

    assert not first["done"] and late[0]
    checkpointed = [line for key in part_keys(aws.s3, spec) for line, _, _ in read_part(aws.s3, BUCKET, key)]
    assert sorted(checkpointed) == [spec.first_line, spec.first_line + 2], "the held line must not be in a part"

    second = run(aws, provider, spec)

    assert second["done"]
    assert sends(provider) == {"ok-1": 1, "flaky": 7, "ok-2": 1}
    rows = [line for key in part_keys(aws.s3, spec) for line, _, _ in read_part(aws.s3, BUCKET, key)]
    assert sorted(rows) == [spec.first_line, spec.first_line + 1, spec.first_line + 2], "each line in one part"
    assert set(shard_file(aws, spec.results_key)) == {"ok-1", "flaky", "ok-2"}
    assert shard_file(aws, spec.errors_key) == {}


def random_faults(ids: list[str], rate: float, seed: int) -> dict[str, list[Action]]:
    """Each attempt of each line a 429 or a 500 with chance `rate`, drawn once from `seed`: the same
    schedule whatever order the attempts come in."""
    rng = random.Random(seed)
    draws = {cid: [rng.random() for _ in range(30)] for cid in ids}
    return {
        cid: [("ok",) if d >= rate else THROTTLED if d < rate / 2 else SERVER_ERROR for d in line]
        for cid, line in draws.items()
    }


# seed 13 draws, among 400 lines at 30% faults, one line whose first 8 attempts fail and one whose first 6 do
FAULT_IDS = [f"r{i}" for i in range(400)]
FAULTS = random_faults(FAULT_IDS, 0.3, seed=13)


def test_the_seeded_schedule_fails_two_lines_under_a_cap_of_six(aws: Aws) -> None:
    spec = replace(shard(aws, FAULT_IDS), max_attempts=6)
    provider = Scripted(script=FAULTS)

    run(aws, provider, spec)

    errors = shard_file(aws, spec.errors_key)
    assert len(errors) == 2
    assert {e["error"]["code"] for e in errors.values()} == {ErrorCode.RETRIES_EXHAUSTED}
    assert max(sends(provider).values()) == 6


def test_random_faults_end_no_line_when_the_job_sizes_its_attempts(aws: Aws) -> None:
    spec = shard(aws, FAULT_IDS)
    assert spec.max_attempts == 0, "the default: as the job needs"
    provider = Scripted(script=FAULTS)

    run(aws, provider, spec)

    assert shard_file(aws, spec.errors_key) == {}
    assert len(shard_file(aws, spec.results_key)) == len(FAULT_IDS)
    # the unlucky line took nine attempts: three, then two rounds of three in the last sweep
    assert max(sends(provider).values()) == 9
    stats = parts_stats(aws.s3, spec)
    assert (stats.swept, stats.recovered_by_sweep) == (stats.recovered_by_sweep, stats.swept) != (0, 0)


def test_a_line_that_fails_where_the_rest_succeed_ends_after_six_attempts(aws: Aws) -> None:
    ids = [f"ok-{i}" for i in range(100)] + ["down"]
    spec = shard(aws, ids)
    provider = Scripted(script={"down": [SERVER_ERROR] * 30})

    run(aws, provider, spec)

    assert sends(provider)["down"] == 6
    (error,) = (e["error"] for e in shard_file(aws, spec.errors_key).values())
    assert error["message"].startswith(
        "gave up after 6 attempts (3, then 3 in the shard's last sweep), as many as 1% of the shard's attempts "
        "failing call for; last: HTTP 500"
    )


def test_no_sweep_round_starts_once_the_sweeps_time_is_up(aws: Aws, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sweep, "SWEEP_MAX_S", 0.0)
    spec = shard(aws, ["ok-1", "down"])
    provider = Scripted(script={"down": [SERVER_ERROR] * 30})

    run(aws, provider, spec)

    # a tiny shard's faults would call for more (`line_attempts`): the time bound ends it after one round
    assert sends(provider)["down"] == 6
    (error,) = (e["error"] for e in shard_file(aws, spec.errors_key).values())
    assert "last sweep), the sweep's 0 s were up; last: HTTP 500" in error["message"]


def test_each_sweep_round_after_the_first_waits_a_backoff_doubling_each_round(aws: Aws) -> None:
    spec = shard(aws, ["ok-1", "down"])
    # answered on its twelfth attempt: three in the first pass, then rounds of three
    provider = Scripted(script={"down": [SERVER_ERROR] * 11})
    pauses: list[float] = []
    outcomes: list[Outcome] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    async def go() -> None:
        async with serve(provider):
            settings = replace(aws.settings, provider_base_url=provider.base_url, retry_base_delay_s=0.001)
            ctx = ShardContext(aws.s3, aws.store, settings, "sk-test", lambda: 900.0, make_session)
            shard_run = ShardRun(ctx, spec, path=Mode.DIRECT, timing=Timing(sleep=pause, rand=lambda: 1.0))
            await shard_run.send(shard_run.pending(), outcomes.append, sweep=True)

    asyncio.run(go())

    assert [(o.custom_id, o.ok, o.attempts) for o in outcomes] == [("ok-1", True, 1), ("down", True, 12)]
    assert pauses == [0.001, 0.002]


def test_past_a_deadlines_cutover_the_sweep_is_one_round(aws: Aws) -> None:
    spec = replace(shard(aws, ["ok-1", "down"]), cutover_at=1.0)
    provider = Scripted(script={"down": [SERVER_ERROR] * 30})

    run(aws, provider, spec)

    assert sends(provider)["down"] == 6
    (error,) = (e["error"] for e in shard_file(aws, spec.errors_key).values())
    assert "last sweep), the deadline's cutover has passed; last: HTTP 500" in error["message"]


def outcome(code: str | None, attempts: int = 1, throttled: int = 0) -> Outcome:
    return Outcome(1, "c", 500, None, None, error_code=code, error_message="m", attempts=attempts, throttled=throttled)


@pytest.mark.parametrize(
    ("code", "expected"),
    [(ErrorCode.RETRIES_EXHAUSTED, True), (ErrorCode.PROVIDER_ERROR, False), (ErrorCode.INVALID_JSON, False)],
)
def test_only_lines_whose_retries_ran_out_are_swept(code: str, expected: bool) -> None:
    assert sweepable(outcome(code)) is expected
    assert not sweepable(outcome(None))


def test_merged_outcome_keeps_the_first_pass_figures() -> None:
    last = merged(outcome(ErrorCode.RETRIES_EXHAUSTED, 6, 2), outcome(None, 2, 1))
    assert (last.attempts, last.throttled, last.swept, last.ok) == (8, 3, True, True)


@pytest.mark.parametrize(("max_attempts", "expected"), [(1, (1, 0)), (2, (1, 1)), (6, (3, 3)), (7, (4, 3))])
def test_the_first_pass_and_the_sweep_share_a_lines_attempts(max_attempts: int, expected: tuple[int, int]) -> None:
    assert split_attempts(max_attempts) == expected


@pytest.mark.parametrize(("concurrency", "expected"), [(1, 1), (4, 4), (50, 5), (1000, 100)])
def test_the_sweep_runs_at_a_tenth_of_the_shard_concurrency(concurrency: int, expected: int) -> None:
    assert sweep_concurrency(concurrency) == expected
