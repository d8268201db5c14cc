"""The live counts `sluice run` draws agree with the job's summary, in every mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sluice_local.cloud import run_job
from sluice_local.progress import LiveCounts
from tests.conftest import request_line, write_jsonl


class Recording(LiveCounts):
    """LiveCounts that also remembers the most lines it saw waiting at the provider."""

    def __init__(self) -> None:
        super().__init__()
        self.most_waiting = 0

    def waiting(self, count: int) -> None:
        super().waiting(count)
        self.most_waiting = max(self.most_waiting, self.snapshot().waiting)


@pytest.mark.parametrize(
    "mode, url, holds",
    [
        ("direct", "/v1/chat/completions", False),
        ("background", "/v1/responses", True),
        ("batch", "/v1/chat/completions", True),
        ("auto", "/v1/chat/completions", True),
    ],
)
def test_live_counts_end_where_the_summary_does(
    make_cloud: Any, simulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, url: str, holds: bool
) -> None:
    cloud = make_cloud(shard_lines=40, poll_seconds=1)
    monkeypatch.setenv("SLUICE_AUTO_BATCH_MIN_REQUESTS", "30")
    simulator.configure(
        batch_phase_s=0.1,
        rate_429=0.1,
        retry_after_s=0.05,
        webhook_url=cloud.webhook_url,
        webhook_secret=cloud.webhook_secret,
    )
    counts = Recording()
    cloud.progress = counts
    rows = [request_line(f"q-{n}", "great value", url=url) for n in range(70)]
    rows.insert(10, b'{"custom_id": "broken", "method": "POST"\n')
    run = run_job(cloud, write_jsonl(tmp_path / f"{mode}.jsonl", rows), metadata={"sluice-mode": mode})

    assert run.status == "SUCCEEDED", (run.summary.get("error"), run.summary)
    seen = counts.snapshot()
    summary = run.summary
    assert (seen.results, seen.errors) == (summary["counts"]["results"], summary["counts"]["errors"])
    assert seen.errors >= 1
    assert (seen.tokens_in, seen.tokens_out) == (summary["tokens"]["input"], summary["tokens"]["output"])
    assert seen.cost_usd == pytest.approx(summary["cost_estimate_usd"]["provider"])
    assert seen.throttled == summary["throttled"]
    assert seen.waiting == 0
    assert (counts.most_waiting > 0) == holds
