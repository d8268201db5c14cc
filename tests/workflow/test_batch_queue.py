"""Batch mode within the provider's enqueued-token limit, end to end (issue 16): the deployed
state machine in moto, the Batch API and its queue limit in the simulator."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import boto3
import openai
import orjson
from sluice.limits.batch_queue import QUEUE_SLOTS, SLOT_NAMES, caught_up, window_of
from sluice.limits.batch_queue_table import read_slot

from sluice_local.cloud import REGION, run_job
from sluice_local.simulator import SimulatorServer
from tests.conftest import write_jsonl
from tests.workflow.helpers.batch import batch_creates, ids, lines, sent_directly


def _tokens(rows: list[bytes]) -> int:
    """What Sluice estimates the rows hold in the queue (a quarter of each body, rounded up)."""
    return sum(math.ceil(len(orjson.dumps(orjson.loads(r)["body"])) / 4) for r in rows)


def _foreign_batch(simulator: SimulatorServer, rows: int) -> str:
    """A batch another program on the same key runs: Sluice's accounting knows nothing of it."""
    client = openai.OpenAI(base_url=simulator.base_url, api_key="sk-test")
    content = b"".join(
        orjson.dumps(
            {
                "custom_id": f"other-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"other {n} " + "y" * 200}]},
            }
        )
        + b"\n"
        for n in range(rows)
    )
    uploaded = client.files.create(file=("other.jsonl", content, "application/jsonl"), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id


def test_a_job_of_three_times_the_queue_limit_finishes_every_line_through_refusals(
    make_cloud, simulator, tmp_path: Path
) -> None:
    rows = lines(120)
    limit = _tokens(rows) // 3
    cloud = make_cloud(shard_lines=40, batch_max_requests=40, poll_seconds=1, batch_queue_tokens=f"gpt-4o-mini={limit}")
    simulator.configure(
        batch_phase_s=0.1,
        batch_queue_limit=limit,
        webhook_url=cloud.webhook_url,
        webhook_secret=cloud.webhook_secret,
    )
    foreign: list[str] = []
    lock = threading.Lock()

    def before(step: str, payload: dict[str, Any]) -> None:
        with lock:
            if step == "submit_batch" and not foreign:
                # just as the first shard submits, another program takes part of the queue for 9 s:
                # long enough to be there when the shard creates its batch however loaded the machine
                simulator.configure(batch_phase_s=3.0)
                foreign.append(_foreign_batch(simulator, 4))
                simulator.configure(batch_phase_s=0.1)

    cloud.before_invoke = before
    path = write_jsonl(tmp_path / "queued.jsonl", rows)
    run = run_job(cloud, path, metadata={"sluice-mode": "batch"})

    assert run.status == "SUCCEEDED"
    assert run.verify(path).ok, run.verify(path).describe()
    assert ids(run.results) == [f"q-{n}" for n in range(120)] and run.errors == []
    assert all(r["response"]["status_code"] == 200 for r in run.results)
    # never the direct fallback: every line went through a batch
    assert not sent_directly(simulator)

    def ours(sim: Any) -> list[Any]:
        return [b for b in sim.batches.values() if b.id not in foreign]

    batches = simulator.call(ours)
    refused = [b for b in batches if b.errors and b.errors[0]["code"] == "token_limit_exceeded"]
    assert refused, "the foreign batch should have made the provider refuse at least one of the job's batches"
    assert all(b.plan in ("completed", "failed") for b in batches)
    assert len(batch_creates(simulator)) == len(batches) + 1
    # a refused batch's uploaded file is deleted, and its part went again under a new attempt number
    assert simulator.call(lambda sim: [b.input_file_id in sim.files for b in refused]) == [False] * len(refused)
    assert simulator.call(lambda sim: all(b.input_file_id in sim.deleted_files for b in refused))
    assert any((b.metadata or {}).get("try", "1") != "1" for b in batches)
    peak = simulator.call(lambda sim: sim.batch_api.peak_enqueued["gpt-4o-mini"])
    assert peak <= limit
    assert sum(s["batch"]["requeued"] for s in run.summary["shards"]) == len(refused)
    # every shard's holds went back to the queue once its batches ended: its slots hold the limit again
    items = boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name).scan()["Items"]
    holds = [i for i in items if str(i["sk"]).startswith("HOLD#")]
    assert holds and all("released" in i for i in holds)
    slots = {SLOT_NAMES.index(str(i["pk"]).rsplit("#", 1)[1]): i for i in items if i["sk"] == "QUEUE" and "win" in i}
    now = window_of(time.time())
    spare = sum(
        caught_up(read_slot(slots[n]) if n in slots else None, n, limit, now)[0].spare for n in range(QUEUE_SLOTS)
    )
    assert spare == limit
