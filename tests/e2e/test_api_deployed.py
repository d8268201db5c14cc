"""`sluice.Client` against a deployed environment: the stack test_cli lays out in moto's server, the
workflow's steps run here as its Lambdas would (test_deployed_resume's `run_pipeline`)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import sluice

from tests.conftest import request_line
from tests.e2e.helpers import cli
from tests.e2e.helpers.cli import Deployed
from tests.e2e.helpers.deployed_resume import run_pipeline

moto_endpoint = cli.moto_endpoint
deployed = cli.deployed


def requests(n: int, prefix: str) -> list[dict[str, object]]:
    return [orjson.loads(request_line(f"{prefix}-{i}", f"review {i}")) for i in range(n)]


def test_submit_wait_and_read_the_results_in_input_order(deployed: Deployed, tmp_path: Path) -> None:
    client = sluice.Client(env="dev")
    job = client.submit(requests(25, "d"), name="reviews", mode="direct")

    # uploaded, with its options as metadata; Plan has not started it yet
    assert job.status() == "SUBMITTED"
    head = deployed.s3.head_object(Bucket=cli.BUCKET, Key="inbox/reviews.jsonl")
    assert head["Metadata"] == {"sluice-mode": "direct"}
    with pytest.raises(sluice.NotReady, match="its outputs are written when it ends"):
        job.results()

    run_pipeline(deployed, "inbox/reviews.jsonl")

    assert job.wait(interval=0.05, timeout=30) == "SUCCEEDED"
    assert [r["custom_id"] for r in job.results()] == [f"d-{i}" for i in range(25)]
    assert list(job.errors()) == []
    assert job.summary()["counts"]["results"] == 25
    assert client.job(job.job_id).progress()["done"] == 25
    files = job.download(tmp_path / "out")
    assert sorted(files) == ["errors", "report", "results", "summary"]
    assert files["results"].read_bytes().count(b"\n") == 25


def test_retry_sends_the_failed_lines_as_a_new_job(deployed: Deployed) -> None:
    deployed.sim.configure(rate_500=0.5)
    client = sluice.Client(env="dev")
    job = client.submit(requests(20, "f"), name="flaky", max_attempts=1)
    run_pipeline(deployed, "inbox/flaky.jsonl", max_attempts=1)
    assert job.wait(interval=0.05, timeout=30) == "COMPLETED_WITH_ERRORS"
    failed = [e["custom_id"] for e in job.errors()]
    assert failed and {e["error"]["code"] for e in job.errors()} == {"retries_exhausted"}

    deployed.sim.configure(rate_500=0.0)
    again = job.retry()
    assert again is not None and again.job_id != job.job_id
    run_pipeline(deployed, "inbox/flaky.retry-1.jsonl")
    assert again.wait(interval=0.05, timeout=30) == "SUCCEEDED"
    assert [r["custom_id"] for r in again.results()] == failed
    assert again.retry() is None


def test_cancel_ends_the_job_cancelled_and_keeps_every_line(deployed: Deployed) -> None:
    client = sluice.Client(env="dev")
    job = client.submit(requests(12, "c"), name="long")
    deployed.start("inbox/long.jsonl")
    assert job.status() == "RUNNING"

    job.cancel()

    assert job.status() == "CANCELLED"
    assert list(job.results()) == []
    assert [(e["custom_id"], e["error"]["code"]) for e in job.errors()] == [(f"c-{i}", "cancelled") for i in range(12)]


def test_what_the_deployed_commands_refuse_raises_their_errors(deployed: Deployed, tmp_path: Path) -> None:
    with pytest.raises(sluice.EnvironmentNotFound, match="unknown environment 'nope': no stack Sluice-nope") as e:
        sluice.Client(env="nope")
    assert e.value.code == 4
    client = sluice.Client(env="dev")
    with pytest.raises(sluice.NotFound, match="no job 'ghost-0123456789ab' in Sluice-dev"):
        client.job("ghost-0123456789ab")
    with pytest.raises(sluice.UsageError, match="argument --mode: invalid choice"):
        client.submit(requests(1, "u"), mode="fast")
    with pytest.raises(sluice.InputError, match="1 invalid line"):
        client.submit([{"custom_id": "x"}])
    # nothing was uploaded
    assert "Contents" not in deployed.s3.list_objects_v2(Bucket=cli.BUCKET)
