"""Every mode takes every endpoint a file may hold."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from local.cloud import run_job
from local.simulator import SimulatorServer
from tests.conftest import request_line, write_jsonl

URLS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions")


def mixed_line(n: int) -> bytes:
    """Line n of a file cycling through all four endpoints."""
    url = URLS[n % len(URLS)]
    if url != "/v1/completions":
        return request_line(f"m-{n}", f"review {n}", url=url)
    body = {"model": "gpt-3.5-turbo-instruct", "prompt": f"review {n}", "max_tokens": 4}
    return orjson.dumps({"custom_id": f"m-{n}", "method": "POST", "url": url, "body": body}) + b"\n"


def posts(simulator: SimulatorServer) -> Counter[tuple[str, str]]:
    """(path, custom_id) of every request the provider was sent directly."""
    return Counter((e["path"], e["custom_id"]) for e in simulator.log if e["method"] == "POST" and e["custom_id"])


@pytest.mark.parametrize("mode", ["direct", "background", "batch", "auto"])
def test_every_mode_runs_a_file_of_every_endpoint_in_input_order(
    mode: str, make_cloud, simulator: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud = make_cloud(shard_lines=40, poll_seconds=1)
    # auto: the two full shards go to the Batch API, the short last one directly
    monkeypatch.setenv("SLUICE_AUTO_BATCH_MIN_REQUESTS", "30")
    simulator.configure(batch_phase_s=0.1, webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret)
    path = write_jsonl(tmp_path / "mixed.jsonl", [mixed_line(n) for n in range(100)])
    run = run_job(cloud, path, metadata={"sluice-mode": mode})

    assert run.errors == [], run.errors[:3]
    assert [r["custom_id"] for r in run.results] == [f"m-{n}" for n in range(100)]
    assert run.verify(path).ok
    assert run.summary["status"] == "SUCCEEDED"
    objects = [r["response"]["body"]["object"] for r in run.results]
    assert objects[:4] == ["chat.completion", "response", "list", "text_completion"]
    expected = {
        "direct": {"direct": 100},
        "background": {"background": 25, "direct": 75},
        "batch": {"batch": 100},
        "auto": {"batch": 80, "direct": 20},
    }[mode]
    assert run.summary["lines_by_path"] == expected
    shard_paths = [s["paths"] for s in run.summary["shards"]]
    assert sum((Counter(p) for p in shard_paths), Counter()) == Counter(expected)

    sent = posts(simulator)
    if mode == "background":
        # only the Responses lines ran in the background; each line was sent once, and the rest directly
        assert all(r["response"]["body"]["background"] for r in run.results if r["custom_id"] in _responses(100))
        assert sent == Counter({(URLS[n % 4], f"m-{n}"): 1 for n in range(100)})
    if mode == "batch":
        # the Batch API takes one endpoint per batch: one batch per endpoint and shard
        assert not sent
        creates = [e for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/batches"]
        assert len(creates) == 3 * len(URLS)


def _responses(count: int) -> set[str]:
    return {f"m-{n}" for n in range(count) if URLS[n % len(URLS)] == "/v1/responses"}
