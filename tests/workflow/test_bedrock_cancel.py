"""A Bedrock batch job still running when its Sluice job is cancelled is stopped at Bedrock
(StopModelInvocationJob), by `sluice cancel` and by a local run's Ctrl-C: nothing is left to run
and be billed, no API key is read, and every line is accounted for."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import boto3
import orjson
from sluice.contract import OUTBOX_PREFIX, output_key
from sluice.plan.plan import job_id_for
from sluice.runners.cancel import cancel_job, open_provider_work
from sluice.store.jobs import JobStore

from sluice_local.cloud import REGION
from sluice_local.interrupt import Signals, stop_run
from tests.conftest import request_line, write_jsonl

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"


def _started(make_cloud: Any, tmp_path: Path) -> tuple[Any, str, str, JobStore]:
    """A job of 120 chat lines in batch mode, its Bedrock job created and held Submitted."""
    cloud = make_cloud(provider="bedrock", shard_lines=200, batch_max_requests=200)
    cloud.bedrock_jobs.paused = True
    lines = [request_line(f"x-{n}").replace(b"gpt-4o-mini", MODEL.encode()) for n in range(120)]
    key, etag = cloud.upload(write_jsonl(tmp_path / "held.jsonl", lines), metadata={"sluice-mode": "batch"})
    job_id = job_id_for(cloud.bucket, key, etag)
    execution = cloud.start(cloud.object_created_event(key, etag), name=job_id)
    store = JobStore(boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name), ttl_days=1)
    deadline = time.monotonic() + 60
    while not open_provider_work(store, job_id).batches:
        assert time.monotonic() < deadline, "the shard never created its Bedrock job"
        time.sleep(0.05)
    (job,) = cloud.bedrock_jobs.jobs()
    assert job.status == "Submitted"
    return cloud, job_id, execution, store


def _errors(cloud: Any) -> list[dict[str, Any]]:
    return [orjson.loads(r) for r in cloud.read(output_key(OUTBOX_PREFIX + "held", "errors")).splitlines()]


def test_sluice_cancel_stops_a_running_bedrock_job_without_reading_a_key(make_cloud, tmp_path: Path) -> None:
    cloud, job_id, _, store = _started(make_cloud, tmp_path)

    def no_key() -> tuple[str, str]:
        raise AssertionError("a Bedrock job's cancel read the provider's key")

    # as `sluice cancel` does it, with the user's credentials (the local cloud's admin)
    report = cancel_job(
        s3=boto3.client("s3", region_name=REGION),
        store=store,
        sfn=boto3.client("stepfunctions", region_name=REGION),
        job_id=job_id,
        provider=no_key,
        bedrock=cloud.bedrock_jobs.client,
    )

    assert (report.batches_cancelled, report.provider_failures) == (1, [])
    assert [job.status for job in cloud.bedrock_jobs.jobs()] == ["Stopped"]
    assert report.summary is not None and report.summary["status"] == "CANCELLED"
    errors = _errors(cloud)
    assert len(errors) == 120 and {e["error"]["code"] for e in errors} == {"cancelled"}


def test_ctrl_c_of_a_local_run_stops_its_bedrock_job(make_cloud, tmp_path: Path) -> None:
    cloud, job_id, execution, _ = _started(make_cloud, tmp_path)
    signals = Signals()
    signals.received.append(signal.SIGINT)

    final = stop_run(cloud, job_id, execution, cloud.provider_base_url, "", signals)

    assert final["status"] == "ABORTED"
    assert [job.status for job in cloud.bedrock_jobs.jobs()] == ["Stopped"]
    errors = _errors(cloud)
    assert len(errors) == 120 and {e["error"]["code"] for e in errors} == {"cancelled"}
