"""Two jobs at once under the environment's cap on shards in flight: both finish with every line,
the shards beyond the cap wait in the workflow for a slot, and no more than the cap ever run."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import boto3
from sluice.contract import ShardSpec
from sluice.limits.shard_slots import SLOTS_KEY
from sluice.plan.plan import job_id_for
from sluice.store.jobs import JobStore

from sluice_local.cloud import REGION, JobRun, run_job
from tests.conftest import cancel_in_cloud, request_line, write_jsonl

CAP = 2


def test_two_jobs_at_once_queue_for_the_caps_slots_and_both_finish(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    # each request takes a while, so that the shards of the two jobs overlap
    simulator.configure(latency_s=0.3)
    cloud = make_cloud(shard_lines=10, concurrency=2, map_concurrency=4, max_shards_in_flight=CAP)
    table = boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name)
    lock = threading.Lock()
    running: set[tuple[str, int]] = set()
    most_running = most_counted = 0
    waits: list[int] = []

    def probe(step: str, payload: dict[str, Any]) -> None:
        """Each shard counts as running from its first provider step to its give-back."""
        nonlocal most_running, most_counted
        shard = ShardSpec.from_dict(payload["shard"]) if "shard" in payload else None
        item = table.get_item(Key=SLOTS_KEY, ConsistentRead=True).get("Item", {})
        with lock:
            most_counted = max(most_counted, int(item.get("inflight", 0)))
            if shard is None:
                return
            if step == "take_slot" and payload.get("slot"):
                waits.append(int(payload["slot"]["waits"]))
            elif step == "run_shard":
                running.add((shard.job_id, shard.shard))
                most_running = max(most_running, len(running))
            elif step == "give_back_slot":
                running.discard((shard.job_id, shard.shard))

    cloud.before_invoke = probe
    inputs = {
        name: write_jsonl(tmp_path / f"{name}.jsonl", [request_line(f"{name}-{n}") for n in range(40)])
        for name in ("first", "second")
    }
    runs: dict[str, JobRun] = {}

    def run(name: str) -> None:
        runs[name] = run_job(cloud, inputs[name], key=f"inbox/{name}.jsonl")

    threads = [threading.Thread(target=run, args=(name,)) for name in inputs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    for name, path in inputs.items():
        assert runs[name].status == "SUCCEEDED", runs[name].execution
        assert runs[name].verify(path).ok
        assert [r["custom_id"] for r in runs[name].results] == [f"{name}-{n}" for n in range(40)]
    # eight shards, four a job at once, two at once in all: some waited for a slot
    assert waits and max(waits) >= 1
    assert 0 < most_running <= CAP
    assert most_counted <= CAP
    assert int(table.get_item(Key=SLOTS_KEY, ConsistentRead=True)["Item"]["inflight"]) == 0


def test_a_cancelled_jobs_slots_come_back_for_the_next_job(make_cloud: Any, simulator: Any, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=5, batch_max_requests=5, poll_seconds=1, max_shards_in_flight=CAP)
    # the batches would run for minutes: the shards hold their slots while they wait for them
    simulator.configure(batch_phase_s=60.0)
    table = boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name)
    store = JobStore(table, ttl_days=1)
    path = write_jsonl(tmp_path / "cancelled.jsonl", [request_line(f"c-{n}") for n in range(10)])
    key, etag = cloud.upload(path, metadata={"sluice-mode": "batch"})
    job_id = job_id_for(cloud.bucket, key, etag)
    execution = cloud.start(cloud.object_created_event(key, etag))
    deadline = time.monotonic() + 60
    while sum(1 for shard in store.shards(job_id) if shard.slot_window is not None) < CAP:
        assert time.monotonic() < deadline, "both shards should hold a slot while their batches run"
        time.sleep(0.1)

    cancel_in_cloud(store, job_id, simulator.base_url)
    cloud.wait(execution, timeout_s=60)

    assert int(table.get_item(Key=SLOTS_KEY, ConsistentRead=True)["Item"]["inflight"]) == 0
    assert [shard.slot_window for shard in store.shards(job_id)] == [None, None]
    simulator.configure(batch_phase_s=0.1)
    later = write_jsonl(tmp_path / "later.jsonl", [request_line(f"l-{n}") for n in range(10)])
    run = run_job(cloud, later)
    assert run.status == "SUCCEEDED" and len(run.results) == 10


def test_a_failed_shard_gives_its_slot_back_and_a_shard_that_waits_for_it_runs(make_cloud: Any, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=10, map_concurrency=4, max_shards_in_flight=1)
    table = boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name)

    def fail_shard_0(step: str, payload: dict[str, Any]) -> None:
        if step == "run_shard" and payload.get("shard", {}).get("shard") == 0:
            raise ValueError("a defect in shard 0")

    cloud.before_invoke = fail_shard_0
    path = write_jsonl(tmp_path / "failing.jsonl", [request_line(f"f-{n}") for n in range(30)])
    run = run_job(cloud, path)

    # one slot in all: the shards ran one after another, the failed one's given back through ShardFailed
    assert run.verify(path).ok
    assert [r["custom_id"] for r in run.results] == [f"f-{n}" for n in range(10, 30)]
    assert {e["error"]["code"] for e in run.errors} == {"shard_failed"}
    assert int(table.get_item(Key=SLOTS_KEY, ConsistentRead=True)["Item"]["inflight"]) == 0
    assert [i.step for i in cloud.invocations].count("give_back_slot") == 3
