"""The response cache on the deployed path: the job bucket's cache/, read by Plan, filled by every mode."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import orjson
import pytest
from sluice.contract import CACHE_PREFIX

from sluice_local.cloud import REGION, LocalCloud, run_job
from tests.conftest import request_line, write_jsonl

SENT = ("/v1/chat/completions", "/v1/responses")


def sent(simulator: Any) -> list[str]:
    """custom_ids of the requests the provider got, directly or in a batch's input file."""
    direct = [str(e["custom_id"]) for e in simulator.log if e["method"] == "POST" and e["path"] in SENT]
    return direct + [
        f"batch:{e['path']}" for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/batches"
    ]


def cache_objects(cloud: LocalCloud) -> dict[str, bytes]:
    s3 = boto3.client("s3", region_name=REGION)
    objects: dict[str, bytes] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=cloud.bucket, Prefix=CACHE_PREFIX):
        for obj in page.get("Contents", []):
            objects[obj["Key"]] = s3.get_object(Bucket=cloud.bucket, Key=obj["Key"])["Body"].read()
    return objects


def lines(n: int, url: str = "/v1/chat/completions") -> list[bytes]:
    return [request_line(f"c-{i}", f"review number {i}", url=url) for i in range(n)]


def test_a_reupload_sends_nothing_and_the_cache_holds_no_secret(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=20)
    path = write_jsonl(tmp_path / "first.jsonl", lines(50))
    first = run_job(cloud, path)
    assert len(sent(simulator)) == 50 and first.summary["cache"]["hits"] == 0
    stored = cache_objects(cloud)
    # one segment and one index per part that held answers (three shards): no object per line
    assert 2 <= len([k for k in stored if k.startswith(f"{CACHE_PREFIX}segments/")]) <= 6
    assert {k.split("/")[1] for k in stored} == {"segments", "index"}

    simulator.clear_log()
    second = run_job(cloud, path, key="inbox/again/first.jsonl")
    assert sent(simulator) == []
    assert second.status == "SUCCEEDED" and second.verify(path).ok
    assert second.summary["cache"] == {
        "mode": "on",
        "hits": 50,
        "misses": 0,
        "saved_usd": first.summary["cost_estimate_usd"]["provider"],
    }
    assert second.summary["lines_by_path"] == {"cache": 50}
    assert all(r["cached"] is True for r in second.results)
    assert [r["response"] for r in second.results] == [r["response"] for r in first.results]
    # cached tokens are not paid again: the job's own tokens and provider cost are nothing
    assert second.summary["tokens"] == {"input": 0, "output": 0}

    # the answers only: never the API key, nor any header
    everything = b"".join(cache_objects(cloud).values())
    assert b"sk-test" not in everything
    assert b"authorization" not in everything.lower() and b"bearer" not in everything.lower()


def test_shards_the_cache_answers_whole_never_run_and_the_rest_send_only_their_misses(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=20)
    first_lines = lines(60)
    run_job(cloud, write_jsonl(tmp_path / "first.jsonl", first_lines))
    # the same 60 lines with a blank line near the start and one edited near the end
    edited = [*first_lines[:5], b"\n", *first_lines[5:50], request_line("c-50", "an edited review"), *first_lines[51:]]
    path = write_jsonl(tmp_path / "edited.jsonl", edited)
    simulator.clear_log()
    since = len(cloud.invocations)
    run = run_job(cloud, path, key="inbox/edited.jsonl")

    assert sent(simulator) == ["c-50"]
    assert run.status == "SUCCEEDED" and run.verify(path).ok
    assert run.summary["cache"]["hits"] == 59 and run.summary["cache"]["misses"] == 1
    # shard 0 was answered whole by Plan, so it grew past 20 lines until the edited line, and no
    # Lambda ran for it; shard 1 (the edited line and the 9 after it) sent its one miss
    ran = [i.payload["shard"]["shard"] for i in cloud.invocations[since:] if i.step == "run_shard"]
    assert ran == [1]
    assert [(s["lines"], s["results"]) for s in run.summary["shards"]] == [(51, 50), (10, 10)]
    assert [r["custom_id"] for r in run.results] == [f"c-{i}" for i in range(60)]
    assert [r["custom_id"] for r in run.results if not r.get("cached")] == ["c-50"]
    job = cloud.job(run.job_id)
    assert job is not None and job.done == 60

    # `sluice status --item` finds a line of a shard that never ran in its results
    from types import SimpleNamespace

    from sluice.contract import manifest_key
    from sluice.merge.merge import load_manifest

    from sluice_local.deployed.lines import line_outcome

    s3 = boto3.client("s3", region_name=REGION)
    assert [s.answered for s in load_manifest(s3, cloud.bucket, manifest_key(run.job_id))] == [True, False]
    deployment: Any = SimpleNamespace(s3=s3)
    shard, record = line_outcome(deployment, job.job, 7) or (None, {})
    assert shard == 0 and record["custom_id"] == "c-5" and record["cached"] is True


def test_a_rerun_all_hits_is_one_shard_and_merge_copies_its_results_server_side(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    # embeddings of 2,000 numbers: 150 answers make more than S3's 5 MiB multipart minimum
    simulator.configure(embedding_dims=2000)
    cloud = make_cloud(shard_lines=50)
    path = write_jsonl(tmp_path / "vectors.jsonl", lines(150, url="/v1/embeddings"))
    first = run_job(cloud, path)
    assert first.status == "SUCCEEDED" and len(first.summary["shards"]) == 3
    simulator.clear_log()
    again = run_job(cloud, path, key="inbox/again/vectors.jsonl")

    assert again.status == "SUCCEEDED" and again.verify(path).ok
    assert [e for e in simulator.log if e["method"] == "POST"] == []
    # Plan answered the whole file as one shard, past the 50 lines a shard that sends may hold
    assert [(s["lines"], s["results"]) for s in again.summary["shards"]] == [(150, 150)]
    size = len(cloud.read("outbox/again/vectors.results.jsonl"))
    assert size > 5 << 20
    # and Merge copied it whole, server-side (under Merge's own IAM statements), not through itself
    assert again.summary["merge"] == {"requests": 1, "bytes_through": 0, "bytes_copied": size, "parts": 1}
    assert [{**r, "cached": None} for r in again.results] == [
        {**r, "id": r2["id"], "cached": None} for r, r2 in zip(first.results, again.results, strict=True)
    ]


def test_a_failed_job_keeps_the_answers_of_the_shards_the_cache_answered(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=20)
    first_lines = lines(40)
    run_job(cloud, write_jsonl(tmp_path / "first.jsonl", first_lines))
    path = write_jsonl(tmp_path / "edited.jsonl", [*first_lines[:39], request_line("c-39", "changed")])

    def break_shard_one(step: str, payload: dict[str, Any]) -> None:
        # the shard fails, and so does the ShardFailed step that would have ended it alone
        if step in ("run_shard", "fail_shard") and payload["shard"]["shard"] == 1:
            raise RuntimeError("disk on fire")

    cloud.before_invoke = break_shard_one
    run = run_job(cloud, path, key="inbox/edited.jsonl")

    assert run.status == "FAILED"
    # shard 0 (lines 1-39, every one a hit) was answered whole and kept; shard 1, the edited
    # line, is accounted for as job_failed
    assert [r["custom_id"] for r in run.results] == [f"c-{i}" for i in range(39)]
    assert [(e["custom_id"], e["error"]["code"]) for e in run.errors] == [("c-39", "job_failed")]


@pytest.mark.parametrize("first_mode", ["batch", "background"])
def test_an_answer_from_one_mode_serves_a_direct_job(
    make_cloud: Any, simulator: Any, tmp_path: Path, first_mode: str
) -> None:
    cloud = make_cloud(shard_lines=20, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1, webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret)
    url = "/v1/responses" if first_mode == "background" else "/v1/chat/completions"
    path = write_jsonl(tmp_path / "modes.jsonl", lines(30, url=url))
    first = run_job(cloud, path, metadata={"sluice-mode": first_mode})
    assert first.status == "SUCCEEDED"
    assert first_mode in first.summary["lines_by_path"]

    simulator.clear_log()
    second = run_job(cloud, path, key="inbox/direct/modes.jsonl", metadata={"sluice-mode": "direct"})
    assert sent(simulator) == []
    assert second.summary["cache"]["hits"] == 30
    assert [r["custom_id"] for r in second.results] == [f"c-{i}" for i in range(30)]
    # what the hits saved is what this job would have paid: sent directly, the full price
    assert second.summary["cache"]["saved_usd"] == first.summary["cost_estimate_usd"]["provider_all_direct"]
    if first_mode == "batch":
        third = run_job(cloud, path, key="inbox/batch/modes.jsonl", metadata={"sluice-mode": "batch"})
        assert sent(simulator) == [] and third.summary["cache"]["hits"] == 30
        # a batch job's re-run saves what the batch cost, half the direct price
        assert third.summary["cache"]["saved_usd"] == first.summary["cost_estimate_usd"]["provider"]
        assert third.summary["cache"]["saved_usd"] < second.summary["cache"]["saved_usd"]


def test_cache_modes_per_job_and_the_per_line_opt_out(make_cloud: Any, simulator: Any, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=20)
    path = write_jsonl(tmp_path / "modes.jsonl", lines(10))

    run_job(cloud, path, metadata={"sluice-cache": "read"})
    assert len(sent(simulator)) == 10 and cache_objects(cloud) == {}
    run_job(cloud, path, key="inbox/b/modes.jsonl", metadata={"sluice-cache": "off"})
    assert len(sent(simulator)) == 20 and cache_objects(cloud) == {}
    run_job(cloud, path, key="inbox/c/modes.jsonl", metadata={"sluice-cache": "write"})
    assert len(sent(simulator)) == 30 and cache_objects(cloud) != {}
    # `write` fills but does not read: the same lines go again
    run_job(cloud, path, key="inbox/d/modes.jsonl", metadata={"sluice-cache": "write"})
    assert len(sent(simulator)) == 40

    # a line that samples opts out next to its custom_id: the provider gets the same body, every time
    sampling = orjson.loads(request_line("sampled", "write me a poem"))
    sampling["body"]["temperature"] = 1.0
    sampling["sluice_cache"] = False
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [*lines(3), orjson.dumps(sampling) + b"\n"])
    simulator.clear_log()
    for attempt in range(2):
        run = run_job(cloud, mixed, key=f"inbox/mixed-{attempt}.jsonl")
        assert run.status == "SUCCEEDED"
    assert sent(simulator) == ["sampled", "sampled"]


def test_a_bad_cache_option_fails_the_job_with_a_clear_reason(make_cloud: Any, simulator: Any, tmp_path: Path) -> None:
    cloud = make_cloud()
    run = run_job(cloud, write_jsonl(tmp_path / "bad.jsonl", lines(3)), metadata={"sluice-cache": "sometimes"})
    assert run.summary["status"] == "FAILED"
    assert "sluice-cache='sometimes'; expected one of on, read, write, off" in str(run.execution) + str(run.summary)
    assert sent(simulator) == []


def test_answers_the_lifecycle_rule_expired_are_sent_again(make_cloud: Any, simulator: Any, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=20)
    path = write_jsonl(tmp_path / "expiring.jsonl", lines(40))
    run_job(cloud, path)
    s3 = boto3.client("s3", region_name=REGION)
    segments = sorted(k for k in cache_objects(cloud) if k.startswith(f"{CACHE_PREFIX}segments/"))
    # as S3's expiration would: the segment goes, its index stays
    gone = segments[0]
    expired = {orjson.loads(row)["response"]["request_id"] for row in cache_objects(cloud)[gone].splitlines()}
    s3.delete_object(Bucket=cloud.bucket, Key=gone)

    simulator.clear_log()
    again = run_job(cloud, path, key="inbox/later/expiring.jsonl")
    assert again.status == "SUCCEEDED" and again.verify(path).ok
    assert len(sent(simulator)) == len(expired) > 0
    assert again.summary["cache"]["hits"] == 40 - len(expired)


def test_a_shard_never_runs_past_shard_lines_because_a_hit_could_not_be_fetched(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=20)
    path = write_jsonl(tmp_path / "gone.jsonl", lines(100))
    run_job(cloud, path)
    # the segment holding lines 41-60 goes (a lifecycle rule, a hand), while the index still names it
    stored = cache_objects(cloud)
    (gone,) = [k for k, v in stored.items() if k.startswith(f"{CACHE_PREFIX}segments/") and b'"c-50"' in v]
    boto3.client("s3", region_name=REGION).delete_object(Bucket=cloud.bucket, Key=gone)

    simulator.clear_log()
    since = len(cloud.invocations)
    again = run_job(cloud, path, key="inbox/later/gone.jsonl")
    assert again.status == "SUCCEEDED" and again.verify(path).ok
    assert sorted(sent(simulator)) == sorted(f"c-{i}" for i in range(40, 60))
    # the lines sent ran in shards of at most 20; the rest were answered by Plan
    ran = [i.payload["shard"] for i in cloud.invocations[since:] if i.step == "run_shard"]
    assert ran and all(shard["lines"] <= 20 for shard in ran)
    assert again.summary["cache"]["hits"] == 80


def age_cache(days: float) -> None:
    """Make every object under cache/ `days` older, as if written then (moto keeps them all)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    from sluice_local.cloud import LocalCloud

    bucket = s3_backends[DEFAULT_ACCOUNT_ID]["global"].buckets[LocalCloud.bucket]
    for name in list(bucket.keys):
        if name.startswith(CACHE_PREFIX):
            bucket.keys[name].last_modified -= timedelta(days=days)


def test_answers_older_than_the_cache_ttl_are_sent_again_though_their_segments_remain(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=20, cache_ttl_days=7)
    path = write_jsonl(tmp_path / "aging.jsonl", lines(40))
    run_job(cloud, path)
    age_cache(5)
    simulator.clear_log()
    assert run_job(cloud, path, key="inbox/5-days/aging.jsonl").summary["cache"]["hits"] == 40
    # 6.5 days on, S3's lifecycle rule has not removed the segments yet, but may any time now
    age_cache(1.5)
    again = run_job(cloud, path, key="inbox/later/aging.jsonl")
    assert again.status == "SUCCEEDED" and again.verify(path).ok
    assert again.summary["cache"]["hits"] == 0 and len(sent(simulator)) == 40


def test_merge_folds_the_indexes_into_a_generation_that_later_jobs_read(
    make_cloud: Any, simulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sluice.cache.compact

    monkeypatch.setattr(sluice.cache.compact, "COMPACT_AT", 3)
    cloud = make_cloud(shard_lines=20)
    first, second = lines(40), [request_line(f"d-{i}", f"other review {i}") for i in range(40)]
    run_job(cloud, write_jsonl(tmp_path / "a.jsonl", first))
    index = [k for k in cache_objects(cloud) if k.startswith(f"{CACHE_PREFIX}index/")]
    assert len(index) == 2 and all(k.endswith(".idx") for k in index)
    # the second job's Merge finds four level-0 indexes, and folds them into a generation
    run_job(cloud, write_jsonl(tmp_path / "b.jsonl", second))
    objects = cache_objects(cloud)
    assert [k for k in objects if k.endswith(".gen")]
    simulator.clear_log()
    again = run_job(cloud, write_jsonl(tmp_path / "c.jsonl", first + second), key="inbox/again/c.jsonl")
    assert again.status == "SUCCEEDED" and sent(simulator) == []
    assert again.summary["cache"]["hits"] == 80
