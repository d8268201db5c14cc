"""What test_anthropic_batch.py and the tests beside it share."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import boto3
from sluice.plan.plan import job_id_for
from sluice.store.jobs import JobStore

from sluice_local.cloud import REGION
from sluice_local.simulator import SimulatorServer
from tests.conftest import cancel_in_cloud


def cancel_while_batched(cloud: Any, simulator: SimulatorServer, path: Path, api_key: str) -> tuple[Any, str]:
    """Start a batch job of `path`, and once its shard has created its batch, cancel the job as
    `sluice cancel` does: (the cancel's report, the job id), the job ended."""
    key, etag = cloud.upload(path, metadata={"sluice-mode": "batch"})
    job_id = job_id_for(cloud.bucket, key, etag)
    execution = cloud.start(cloud.object_created_event(key, etag))
    store = JobStore(boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name), ttl_days=1)
    deadline = time.monotonic() + 60
    while not any(any(shard.batch_ids or ()) for shard in store.shards(job_id)):
        assert time.monotonic() < deadline, "the shard should have created its batch"
        time.sleep(0.05)

    report = cancel_in_cloud(store, job_id, simulator.base_url, api_key)
    cloud.wait(execution, timeout_s=60)
    return report, job_id
