"""The shared limit through the whole workflow, against the simulator's per-key quota (issue 16):
a token quota binds the job's pace, and a 429 that says the quota is spent pauses every shard."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import orjson

from sluice_local.cloud import REGION, run_job
from tests.conftest import write_jsonl

API_KEY = "sk-test"


def _line(n: int) -> bytes:
    body = {"model": "gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": f"Say hi to {n}"}]}
    return orjson.dumps({"custom_id": f"q-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + b"\n"


def _spend_the_quota(base_url: str, words: int) -> None:
    """Another client on the same key empties the provider's buckets, which start full with a
    minute's worth: the job then meets the quota's refill, not its first minute."""
    body = {"model": "gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "word " * words}]}
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(request, timeout=10).read()


def _limit_items(cloud: Any) -> list[dict[str, Any]]:
    table = boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name)
    return [i for i in table.scan()["Items"] if str(i["pk"]).startswith("LIMIT#")]


def test_a_token_quota_paces_the_job_with_few_429s(make_cloud: Any, simulator: Any, tmp_path: Path) -> None:
    tpm = 3600
    simulator.configure(quota_rpm=60_000, quota_tpm=tpm)
    # about 3,900 tokens: more than the bucket holds, so it is empty when the job starts
    _spend_the_quota(simulator.base_url, 3000)
    simulator.clear_log()
    path = write_jsonl(tmp_path / "tpm.jsonl", [_line(n) for n in range(40)])
    # one request in flight a shard: before an answer tells the rate, a shard sends at its own
    # concurrency, and that first request may meet the empty bucket
    cloud = make_cloud(shard_lines=10, concurrency=4, map_concurrency=4, max_attempts=8)

    started = time.monotonic()
    run = run_job(cloud, path)
    wall = time.monotonic() - started

    assert run.verify(path).ok and len(run.results) == 40
    tokens = run.summary["tokens"]["input"] + run.summary["tokens"]["output"]
    calls = [e for e in simulator.log if e["path"].endswith("/chat/completions")]
    limited = sum(1 for e in calls if e["status"] == 429)
    # the four shards' first requests may meet the empty bucket; the leased requests hardly ever do
    assert limited <= 4 + len(calls) * 0.05, Counter(e["status"] for e in calls)
    # paced by the token rate (60 a second), not by the requests quota (1,000 a second)
    assert wall >= tokens / (tpm / 60) * 0.6
    (item,) = _limit_items(cloud)
    assert float(item["token_rate"]) == tpm / 60


def test_a_spent_quota_pauses_every_shard_and_the_bucket_follows_the_real_limit(
    make_cloud: Any, simulator: Any, tmp_path: Path
) -> None:
    tpm = 7200
    simulator.configure(quota_rpm=60_000, quota_tpm=tpm)
    _spend_the_quota(simulator.base_url, 6000)
    simulator.clear_log()
    path = write_jsonl(tmp_path / "drain.jsonl", [_line(n) for n in range(120)])
    # the environment believes the key allows ten times the tokens it does
    cloud = make_cloud(
        shard_lines=30,
        concurrency=120,
        map_concurrency=4,
        max_attempts=10,
        rate_limits=json.dumps({"gpt-4o-mini": {"rpm": 60_000, "tpm": tpm * 10}}),
    )

    run = run_job(cloud, path)

    assert run.verify(path).ok and len(run.results) == 120
    calls = [e for e in simulator.log if e["path"].endswith("/chat/completions")]
    limited = sorted(e["t"] for e in calls if e["status"] == 429)
    # the seed sends a first wave into the empty quota; its first 429 drains and pauses the shared
    # bucket and the headers bring its rates down to the real ones, so after that wave the shards
    # keep to the quota instead of each meeting it again and again
    assert limited, "the seed was meant to overshoot"
    later = [t for t in limited if t > limited[0] + 2.0]
    assert len(later) <= 4, (len(limited), len(later), Counter(e["status"] for e in calls))
    (item,) = _limit_items(cloud)
    assert float(item["token_rate"]) == tpm / 60
    assert float(item["paused_until"]) > 0
