"""Keys with spaces, `+` and non-ASCII start exactly one job on the right object, however the event spells them."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

import orjson
import pytest
from sluice.plan.plan import job_id_for, output_prefix

from sluice_local.cloud import LocalCloud
from tests.conftest import request_line, write_jsonl

KEYS = ["inbox/my reviews.jsonl", "inbox/c++ & co.jsonl", "inbox/Bewertungen für Köln.jsonl", "inbox/a+b c.jsonl"]


def s3_notification_key(key: str) -> str:
    """How S3's event notifications spell a key: URL-encoded, a space as `+`."""
    return urllib.parse.quote_plus(key, safe="/")


def start(cloud: LocalCloud, key: str, etag: str, event_key: str, name: str) -> dict[str, Any]:
    event = cloud.object_created_event(key, etag)
    event["detail"]["object"]["key"] = event_key
    return cloud.wait(cloud.start(event, name=name))


def outputs(cloud: LocalCloud, key: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    prefix = output_prefix(key)
    results = [orjson.loads(row) for row in cloud.read(prefix + ".results.jsonl").splitlines()]
    return results, orjson.loads(cloud.read(prefix + ".summary.json"))


@pytest.mark.parametrize("key", KEYS)
def test_either_spelling_of_the_key_runs_one_job_on_that_object(make_cloud, tmp_path: Path, key: str) -> None:
    cloud = make_cloud()
    path = write_jsonl(tmp_path / "input.jsonl", [request_line(f"k-{n}") for n in range(12)])
    key, etag = cloud.upload(path, key=key)
    encoded = s3_notification_key(key)
    assert encoded != key

    job_id = job_id_for(cloud.bucket, key, etag)

    first = start(cloud, key, etag, encoded, "encoded")
    assert first["status"] == "SUCCEEDED", first
    results, summary = outputs(cloud, key)
    assert [r["custom_id"] for r in results] == [f"k-{n}" for n in range(12)]
    assert summary["job_id"] == job_id and summary["input"] == f"s3://{cloud.bucket}/{key}"

    # the same object announced with its plain key is the same job: it does not run again
    again = start(cloud, key, etag, key, "plain")
    assert again["status"] == "SUCCEEDED"
    state = orjson.loads(again["output"])
    assert state["duplicate"] is True and state["job_id"] == job_id and state["key"] == key
    assert sum(1 for i in cloud.invocations if i.step == "merge") == 1


def test_a_plus_and_a_space_are_told_apart_by_the_objects_etag(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud()
    plus = write_jsonl(tmp_path / "plus.jsonl", [request_line(f"plus-{n}") for n in range(5)])
    space = write_jsonl(tmp_path / "space.jsonl", [request_line(f"space-{n}") for n in range(7)])
    plus_key, plus_etag = cloud.upload(plus, key="inbox/x+y.jsonl")
    space_key, space_etag = cloud.upload(space, key="inbox/x y.jsonl")

    # both events say `inbox/x+y.jsonl`; each one's ETag says which object it is about
    assert start(cloud, space_key, space_etag, "inbox/x+y.jsonl", "space")["status"] == "SUCCEEDED"
    assert start(cloud, plus_key, plus_etag, "inbox/x+y.jsonl", "plus")["status"] == "SUCCEEDED"

    space_results, _ = outputs(cloud, space_key)
    plus_results, _ = outputs(cloud, plus_key)
    assert [r["custom_id"] for r in space_results] == [f"space-{n}" for n in range(7)]
    assert [r["custom_id"] for r in plus_results] == [f"plus-{n}" for n in range(5)]
    assert sum(1 for i in cloud.invocations if i.step == "merge") == 2


def test_a_failed_plan_reports_under_the_objects_own_name(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud()
    path = write_jsonl(tmp_path / "bad.jsonl", [request_line("b-0")])
    key, etag = cloud.upload(path, key="inbox/bad option.jsonl", metadata={"sluice-mode": "turbo"})
    run = start(cloud, key, etag, s3_notification_key(key), "bad")
    assert run["status"] == "SUCCEEDED"  # refused at Plan: the job FAILED, the execution did not
    summary = orjson.loads(cloud.read(output_prefix(key) + ".summary.json"))
    assert summary["status"] == "FAILED"
    assert summary["job_id"] == job_id_for(cloud.bucket, key, etag)
    assert "sluice-mode" in summary["error"]
