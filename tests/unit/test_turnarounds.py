"""Batch turnarounds measured (issue 44): a completed batch's created-to-completed time, read from each
provider's wire; Merge keeping a job's figures in one object per family and model; Plan and
`sluice estimate` reading them back; `sluice run` carrying them between its fresh local clouds."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.contract import Settings, turnarounds_key
from sluice.merge.merge import keep_measured, load_manifest, merge_job
from sluice.plan.deadline import AtLeast, expected_turnaround
from sluice.plan.turnarounds import KEPT, keep_turnarounds, read_turnarounds
from sluice.providers.anthropic.batch_wire import batch_status as anthropic_status
from sluice.providers.batch import BatchCounts, BatchState
from sluice.providers.bedrock.batch import BedrockBatchApi
from sluice.providers.openai.batch import batch_status as openai_status
from sluice.store.jobs import JobStore

from sluice_local.cli.estimate_deadline import measured
from sluice_local.cloud import create_table
from sluice_local.turnarounds import copy_back, read_local, seed, turnarounds_root
from tests.unit.helpers.failure import BUCKET, LINES, failed_job

SETTINGS = Settings(bucket=BUCKET, table="jobs", provider_base_url="http://127.0.0.1:9", api_key_secret_arn="-")


# measuring: a completed batch's created-to-completed seconds, none for any other end


def test_an_openai_batch_that_completed_is_measured_created_to_completed() -> None:
    batch = SimpleNamespace(status="completed", created_at=1000, in_progress_at=1010, completed_at=1750, metadata=None)
    assert openai_status(batch).measured_turnaround_s == 750.0


@pytest.mark.parametrize("status", ["cancelled", "expired", "failed"])
def test_an_openai_batch_that_ended_otherwise_is_not_measured(status: str) -> None:
    # its end says only that it had not completed by then (a censored figure)
    batch = SimpleNamespace(status=status, created_at=1000, **{f"{status}_at": 1300}, metadata=None)
    found = openai_status(batch)
    assert found.ended_at == 1300.0 and found.measured_turnaround_s is None


def test_an_openai_batch_that_names_no_completion_is_not_measured_from_a_stand_in() -> None:
    batch = SimpleNamespace(status="completed", created_at=1000, finalizing_at=1200, metadata=None)
    found = openai_status(batch)
    assert found.ended_at == 1200.0 and found.measured_turnaround_s is None


def _message_batch(**fields: Any) -> dict[str, Any]:
    return {
        "id": "msgbatch_1",
        "processing_status": "ended",
        "request_counts": {"succeeded": 3},
        "created_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T00:40:00Z",
        "cancel_initiated_at": None,
        **fields,
    }


def test_a_message_batch_that_completed_is_measured_and_one_cancelled_is_not() -> None:
    assert anthropic_status(_message_batch()).measured_turnaround_s == 2400.0
    cancelled = _message_batch(
        request_counts={"succeeded": 1, "canceled": 2}, cancel_initiated_at="2026-01-01T00:10:00Z"
    )
    found = anthropic_status(cancelled)
    assert found.state == BatchState.CANCELLED and found.measured_turnaround_s is None


@pytest.mark.parametrize(
    ("state", "seconds"), [("Completed", 3600.0), ("PartiallyCompleted", 3600.0), ("Stopped", None)]
)
def test_a_bedrock_job_is_measured_only_when_it_completed(state: str, seconds: float | None) -> None:
    job = {
        "jobArn": "arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/abc",
        "status": state,
        "submitTime": 1000.0,
        "endTime": 4600.0,
    }
    api = object.__new__(BedrockBatchApi)  # reading a job's description touches no client
    assert api._status(job, BatchCounts()).measured_turnaround_s == seconds


# keeping: one object per family and model, the latest KEPT figures


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def test_keeping_appends_to_what_earlier_jobs_kept_and_caps_at_the_latest(s3: Any) -> None:
    assert read_turnarounds(s3, BUCKET, "openai", "gpt-4o-mini") == []
    keep_turnarounds(s3, BUCKET, "openai", {"gpt-4o-mini": [600.0, 700.0]})
    keep_turnarounds(s3, BUCKET, "openai", {"gpt-4o-mini": [800.0]})
    assert read_turnarounds(s3, BUCKET, "openai", "gpt-4o-mini") == [600.0, 700.0, 800.0]
    stored = orjson.loads(s3.get_object(Bucket=BUCKET, Key="turnarounds/openai/gpt-4o-mini.json")["Body"].read())
    assert stored["family"] == "openai" and stored["model"] == "gpt-4o-mini"

    keep_turnarounds(s3, BUCKET, "openai", {"gpt-4o-mini": [float(n) for n in range(KEPT)]})
    kept = read_turnarounds(s3, BUCKET, "openai", "gpt-4o-mini")
    assert len(kept) == KEPT == 100 and kept == [float(n) for n in range(KEPT)]
    # another model, or another family, is an object of its own
    assert read_turnarounds(s3, BUCKET, "anthropic", "gpt-4o-mini") == []


def test_a_model_named_by_an_arn_is_one_key_under_its_family() -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-haiku-20241022-v1:0"
    key = turnarounds_key("bedrock", arn)
    assert key.startswith("turnarounds/bedrock/") and key.count("/") == 2 and key.endswith(".json")


def test_nothing_measured_writes_nothing(s3: Any) -> None:
    calls: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(s3, name)

    keep_measured(Counting(), BUCKET, SETTINGS, {})
    keep_measured(Counting(), BUCKET, SETTINGS, {"gpt-4o-mini": []})
    assert calls == []


def test_a_damaged_object_plans_on_the_default_rather_than_failing(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key=turnarounds_key("openai", "m"), Body=b'{"turnarounds_s": ["x", -1, 5, true]}')
    assert read_turnarounds(s3, BUCKET, "openai", "m") == [5.0]


@pytest.fixture
def store(s3: Any) -> JobStore:
    create_table(boto3.client("dynamodb", region_name="us-east-1"), "jobs")
    return JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table("jobs"), ttl_days=1)


def _batch_job(s3: Any, store: JobStore, batches: list[list[dict[str, Any]]]) -> Any:
    """A finished job whose shards ran as batches, each shard's report listing `batches`."""
    state = failed_job(s3, store, shards=len(batches), done=dict.fromkeys(range(len(batches)), LINES), part_rows=4)
    specs = [dataclasses.replace(spec, mode="batch") for spec in load_manifest(s3, BUCKET, state.manifest_key)]
    s3.put_object(Bucket=BUCKET, Key=state.manifest_key, Body=orjson.dumps([dataclasses.asdict(s) for s in specs]))
    for spec, listed in zip(specs, batches, strict=True):
        report = {"batches": listed, "fallback_lines": 0, "requeued": 0, "batch_models": {}}
        s3.put_object(Bucket=BUCKET, Key=spec.batch_report_key, Body=orjson.dumps(report))
    return state


def test_merge_keeps_the_batches_turnarounds_by_model_the_cancelled_ones_censored(s3: Any, store: JobStore) -> None:
    completed = {"id": "b1", "status": "completed", "turnaround_s": 600, "model": "gpt-4o-mini", "measured_s": 600.0}
    cancelled = {
        "id": "b2", "status": "cancelled", "turnaround_s": 900, "model": "gpt-4o-mini", "measured_s": None,
        "censored_s": 900.0,
    }  # fmt: skip
    # a row written before batches carried a measurement: nothing to keep of it
    older = {"id": "b3", "status": "completed", "turnaround_s": 300}
    nameless = {"id": "b4", "status": "completed", "turnaround_s": 60, "model": None, "measured_s": 60.0}
    state = _batch_job(s3, store, [[completed, cancelled], [older, nameless]])
    merge_job(s3=s3, store=store, state=state, settings=dataclasses.replace(SETTINGS, default_model="gpt-4.1"))
    figures = read_turnarounds(s3, BUCKET, "openai", "gpt-4o-mini")
    assert figures == [600.0, 900.0] and [isinstance(f, AtLeast) for f in figures] == [False, True]
    # a batch whose rows named no model ran the environment's default
    assert read_turnarounds(s3, BUCKET, "openai", "gpt-4.1") == [60.0]


def test_merge_writes_no_turnarounds_when_no_batch_was_measured(s3: Any, store: JobStore) -> None:
    # a row written before cancelled batches were kept censored: nothing to keep of it
    cancelled = {"id": "b2", "status": "cancelled", "turnaround_s": 900, "model": "gpt-4o-mini", "measured_s": None}
    state = _batch_job(s3, store, [[cancelled]])
    merge_job(s3=s3, store=store, state=state, settings=SETTINGS)
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="turnarounds/").get("KeyCount") == 0


# using: the plan reads the 90% point of what was kept


def test_what_was_kept_is_what_a_deadline_plans_on(s3: Any) -> None:
    keep_turnarounds(s3, BUCKET, "openai", {"gpt-4o-mini": [float(n) for n in range(1, 11)]})
    turnaround, source = expected_turnaround("openai", read_turnarounds(s3, BUCKET, "openai", "gpt-4o-mini"))
    assert turnaround == 9.0 and source.startswith("measured")


def test_censored_turnarounds_move_the_quantile_up_and_never_short() -> None:
    quick = [60.0] * 8
    # dropped, the two batches cancelled after 10 min left a 90% point of a minute
    assert expected_turnaround("openai", quick)[0] == 60.0
    # censored, they say the 90% point is past 10 min: unknown beyond it, so the longer of it and the default
    at, source = expected_turnaround("openai", [*quick, AtLeast(600.0), AtLeast(600.0)])
    assert at == 6 * 3600.0 and "2 of them cancelled or expired" in source
    assert expected_turnaround("anthropic", [*quick, AtLeast(600.0), AtLeast(600.0)])[0] == 3600.0
    # Kaplan-Meier: 18 completed in 1 to 18 min, two cancelled after 18.5 min: dropped, the 90% point
    # was the 17th figure; counted as still running to 18.5 min, it is the 18th
    figures = [float(n) * 60 for n in range(1, 19)]
    assert expected_turnaround("openai", figures)[0] == 17 * 60.0
    assert expected_turnaround("openai", [*figures, AtLeast(1110.0), AtLeast(1110.0)])[0] == 18 * 60.0
    # a censored figure shorter than every completion changes nothing it should not
    assert expected_turnaround("openai", [*[60.0] * 9, AtLeast(1.0)])[0] == 60.0


def test_censored_figures_round_trip_flagged(s3: Any) -> None:
    keep_turnarounds(s3, BUCKET, "openai", {"gpt-4o-mini": [600.0, AtLeast(7200.0)]})
    body = orjson.loads(s3.get_object(Bucket=BUCKET, Key="turnarounds/openai/gpt-4o-mini.json")["Body"].read())
    assert body["turnarounds_s"] == [600.0, {"at_least_s": 7200.0}]
    figures = read_turnarounds(s3, BUCKET, "openai", "gpt-4o-mini")
    assert figures == [600.0, 7200.0] and isinstance(figures[1], AtLeast)


# local runs: the cache directory carries the figures from one fresh local cloud to the next


class FakeBucket:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def read(self, key: str) -> bytes:
        return self.objects[key]

    def write(self, key: str, body: bytes) -> None:
        self.objects[key] = body

    def keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))


def test_a_run_seeds_its_bucket_from_the_cache_dir_and_copies_back_what_merge_kept(tmp_path: Path) -> None:
    root = turnarounds_root(tmp_path, simulated=False)
    first = FakeBucket()
    assert seed(first, root) == 0
    first.write(turnarounds_key("openai", "gpt-4o-mini"), b'{"turnarounds_s": [600.0]}')
    assert copy_back(first, root) == [tmp_path / "turnarounds" / "openai" / "gpt-4o-mini.json"]
    assert read_local(root, "openai", "gpt-4o-mini") == [600.0]

    second = FakeBucket()
    assert seed(second, root) == 1
    assert second.objects == first.objects
    # nothing changed, nothing rewritten
    assert copy_back(second, root) == []
    # the simulator's figures are kept apart: its batches say nothing of a provider's
    assert read_local(turnarounds_root(tmp_path, simulated=True), "openai", "gpt-4o-mini") == []


def test_estimate_reads_the_figures_a_run_with_the_same_provider_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    root = turnarounds_root(tmp_path, simulated=True)
    path = root / turnarounds_key("openai", "gpt-4o-mini")
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"turnarounds_s": [1.0, 2.0]}')
    est = SimpleNamespace(by_model={"gpt-4o-mini": None, "(no model)": None})
    args = argparse.Namespace(provider="openai", model=None, cache_dir=str(tmp_path))
    assert measured(args, est) == [1.0, 2.0]  # type: ignore[arg-type]
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.openai.com/v1")
    assert measured(args, est) == []  # type: ignore[arg-type]
