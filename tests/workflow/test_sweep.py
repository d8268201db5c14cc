"""The last sweep through the whole workflow: lines whose first attempts ran out on 500s get the rest later."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sluice_local.cloud import run_job
from sluice_local.simulator import decide_fault
from tests.conftest import request_line, write_jsonl


def test_lines_that_ran_out_of_attempts_get_one_more_pass_before_they_go_to_errors(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    config = simulator.configure(rate_500=0.5)

    # the simulator's faults are a pure function of (seed, custom id, attempt): pick lines by them
    def faults(cid: str, attempts: int) -> list[bool]:
        return [decide_fault(config, cid, attempt) is not None for attempt in range(attempts)]

    ids = [f"s-{i}" for i in range(400)]
    recovered = [cid for cid in ids if faults(cid, 3) == [True, True, False]][:3]
    lost = [cid for cid in ids if faults(cid, 4) == [True] * 4][:2]
    clean = [cid for cid in ids if faults(cid, 1) == [False]][:20]
    chosen = recovered + lost + clean
    assert len(recovered) == 3 and len(lost) == 2
    path = write_jsonl(tmp_path / "sweep.jsonl", [request_line(cid) for cid in sorted(chosen)])
    # two attempts in the first pass, the other two in the last sweep
    cloud = make_cloud(shard_lines=10, concurrency=10, max_attempts=4)

    run = run_job(cloud, path)

    assert run.verify(path).ok
    assert {r["custom_id"] for r in run.results} == set(recovered + clean)
    assert {e["custom_id"] for e in run.errors} == set(lost)
    for error in run.errors:
        assert error["error"]["code"] == "retries_exhausted"
        assert error["error"]["message"].startswith("gave up after 4 attempts (2, then 2 in the shard's last sweep)")
    sent = Counter(e["custom_id"] for e in simulator.log if e["method"] == "POST" and e["custom_id"])
    assert {cid: sent[cid] for cid in recovered} == dict.fromkeys(recovered, 3)
    assert {cid: sent[cid] for cid in lost} == dict.fromkeys(lost, 4)
    assert {cid: sent[cid] for cid in clean} == dict.fromkeys(clean, 1)
    assert run.summary["sweep"] == {"swept": 5, "recovered": 3}
    assert run.summary["counts"]["errors"] == 2


@pytest.mark.parametrize(("max_attempts", "errors"), [(6, 1), (0, 0)])
def test_a_line_whose_first_seven_attempts_fail_at_random_ends_in_errors_only_under_a_cap_of_six(
    make_cloud: Any, simulator: Any, tmp_path: Path, max_attempts: int, errors: int
) -> None:
    config = simulator.configure(rate_500=0.3)
    ids = [f"f-{i}" for i in range(2000)]
    # the simulator's faults are drawn from (seed, custom id, attempt): the same schedule every run
    unlucky = next(
        cid for cid in ids if [decide_fault(config, cid, n) is not None for n in range(8)] == [True] * 7 + [False]
    )
    chosen = sorted({unlucky, *ids[:40]})
    path = write_jsonl(tmp_path / "random.jsonl", [request_line(cid) for cid in chosen])
    cloud = make_cloud(shard_lines=100, concurrency=10, max_attempts=max_attempts)

    run = run_job(cloud, path)

    assert run.verify(path).ok
    assert run.summary["counts"]["errors"] == errors
    if errors:
        (error,) = run.errors
        assert error["custom_id"] == unlucky
        assert error["error"]["message"].startswith(
            "gave up after 6 attempts (3, then 3 in the shard's last sweep), the job's max-attempts of 6"
        )
        assert run.summary["max_line_attempts"] == 6
    else:
        # three, then rounds of three while 30% of attempts failing call for more: the eighth answers
        assert run.summary["max_line_attempts"] == 8


def test_a_background_line_the_sweep_submitted_counts_as_swept_once_collected(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    config = simulator.configure(rate_500=0.5, latency_s=0.3)

    def faults(cid: str, attempts: int) -> list[bool]:
        return [decide_fault(config, cid, attempt) is not None for attempt in range(attempts)]

    ids = [f"b-{i}" for i in range(400)]
    recovered = [cid for cid in ids if faults(cid, 3) == [True, True, False]][:2]
    clean = [cid for cid in ids if faults(cid, 1) == [False]][:6]
    assert len(recovered) == 2
    lines = [request_line(cid, url="/v1/responses") for cid in sorted(recovered + clean)]
    path = write_jsonl(tmp_path / "sweep-bg.jsonl", lines)
    cloud = make_cloud(shard_lines=10, concurrency=10, max_attempts=4)

    run = run_job(cloud, path, metadata={"sluice-mode": "background"})

    assert run.verify(path).ok
    assert {r["custom_id"] for r in run.results} == set(recovered + clean)
    # the sweep's submissions were still running when submitted: their mark travelled on the item row
    assert run.summary["sweep"] == {"swept": 2, "recovered": 2}
    assert sum(s["swept"] for s in run.summary["shards"]) == 2
