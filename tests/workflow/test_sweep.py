"""The last sweep through the whole workflow: lines whose first attempts ran out on 500s get the rest later."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from local.cloud import run_job
from local.simulator import decide_fault
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
