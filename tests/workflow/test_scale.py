"""Scale under faults: 5,000 lines with 10% 429s and 5% 500s, every line accounted for.

The 50,000-line version is `bench/e2e.py --lines 50000 --rate-429 0.1 --rate-500 0.05`.
"""

from __future__ import annotations

from pathlib import Path

from sluice_local.cloud import run_job
from tests.conftest import request_line, write_jsonl


def test_five_thousand_lines_under_429s_and_500s(make_cloud, simulator, tmp_path: Path) -> None:
    simulator.configure(latency_s=0.02, rate_429=0.10, rate_500=0.05, retry_after_s=0.1)
    cloud = make_cloud(shard_lines=1000, map_concurrency=5, concurrency=500, max_attempts=8)
    path = write_jsonl(tmp_path / "scale.jsonl", [request_line(f"s-{n}") for n in range(5000)])
    run = run_job(cloud, path)

    assert run.status == "SUCCEEDED"
    report = run.verify(path)
    assert report.ok, report.describe()
    assert report.results + report.errors == 5000
    # with 8 attempts a line fails only after eight faults in a row: none should
    assert report.results == 5000
    assert run.summary["throttled"] > 300 and run.summary["retries"] > 500
