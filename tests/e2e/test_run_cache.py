"""`sluice run` pays once: a re-run answers from the response cache, and a killed run resumes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from sluice_local.simulator import SimConfig, SimulatorServer
from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
REVIEWS = ROOT / "examples" / "reviews.jsonl"
SENT = ("/v1/chat/completions", "/v1/responses")


def _env(provider: SimulatorServer) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}",
        "OPENAI_BASE_URL": provider.base_url,
        "OPENAI_API_KEY": "sk-cache-test-key",
    }


def _command(path: Path, out: Path, cache: Path | None) -> list[str]:
    where = ["--cache-dir", str(cache)] if cache is not None else []
    return [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--out", str(out), *where]


def _run(provider: SimulatorServer, path: Path, out: Path, cache: Path | None, *extra: str) -> dict[str, Any]:
    command = [*_command(path, out, cache), "--quiet", *extra]
    done = subprocess.run(command, cwd=ROOT, env=_env(provider), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    summary: dict[str, Any] = orjson.loads((out / f"{path.stem}.summary.json").read_bytes())
    return summary


def _sent(provider: SimulatorServer) -> list[str]:
    """The custom_id of every request the job sent (chat completions and responses)."""
    return [str(e["custom_id"]) for e in provider.log if e["method"] == "POST" and e["path"] in SENT]


def test_rerun_sends_nothing_and_gives_the_same_results_and_an_edit_sends_only_the_edited(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with SimulatorServer(SimConfig(latency_s=0.01, api_key="sk-cache-test-key")) as provider:
        first = _run(provider, REVIEWS, tmp_path / "first", cache)
        sent_first = len(_sent(provider))
        provider.clear_log()
        second = _run(provider, REVIEWS, tmp_path / "second", cache)
        sent_second = len(_sent(provider))

        lines = REVIEWS.read_bytes().splitlines(keepends=True)
        edited_at = list(range(5, 2000, 200))
        for n in edited_at:
            doc = orjson.loads(lines[n])
            body = doc["body"]
            if "messages" in body:
                body["messages"][0]["content"] += " (edited)"
            else:
                body["input"] += " (edited)"
            lines[n] = orjson.dumps(doc) + b"\n"
        edited = write_jsonl(tmp_path / "reviews.jsonl", lines)
        provider.clear_log()
        third = _run(provider, edited, tmp_path / "third", cache)
        sent_third = _sent(provider)

    assert sent_first == 2000 and first["cache"]["hits"] == 0
    assert sent_second == 0
    assert second["cache"] == {
        "mode": "on",
        "hits": 2000,
        "misses": 0,
        "saved_usd": first["cost_estimate_usd"]["provider"],
    }
    # the results are the first run's, byte for byte, with `"cached": true` added outside the response
    before = (tmp_path / "first" / "reviews.results.jsonl").read_bytes().splitlines()
    after = (tmp_path / "second" / "reviews.results.jsonl").read_bytes().splitlines()
    assert [row.replace(b',"cached":true}', b"}") for row in after] == before
    assert all(orjson.loads(row)["cached"] is True for row in after)
    # an edited file: only its ten edited lines go to the provider
    assert sorted(sent_third) == sorted(orjson.loads(lines[n])["custom_id"] for n in edited_at)
    assert third["cache"]["hits"] == 1990 and third["cache"]["misses"] == 10
    results = [orjson.loads(r) for r in (tmp_path / "third" / "reviews.results.jsonl").read_bytes().splitlines()]
    assert [r["custom_id"] for r in results] == [orjson.loads(line)["custom_id"] for line in lines]
    assert [n for n, r in enumerate(results) if not r.get("cached")] == edited_at


def test_no_cache_sends_everything_and_keeps_nothing(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "small.jsonl", [request_line(f"s-{n}", f"text {n}") for n in range(20)])
    # the default cache directory (the test's own, under XDG_CACHE_HOME)
    cache = Path(os.environ["XDG_CACHE_HOME"]) / "sluice"
    with SimulatorServer(SimConfig(latency_s=0.01, api_key="sk-cache-test-key")) as provider:
        _run(provider, path, tmp_path / "a", None, "--no-cache")
        _run(provider, path, tmp_path / "b", None, "--no-cache")
        sent = _sent(provider)
    assert len(sent) == 40
    assert not cache.exists() or not any(cache.rglob("*.seg"))


def test_a_run_killed_with_sigkill_resumes_sending_each_line_once(tmp_path: Path) -> None:
    lines = 300
    concurrency = 10
    path = write_jsonl(tmp_path / "long.jsonl", [request_line(f"k-{n}", f"review {n}") for n in range(lines)])
    cache = tmp_path / "cache"
    with SimulatorServer(SimConfig(latency_s=0.3, api_key="sk-cache-test-key")) as provider:
        command = [*_command(path, tmp_path / "killed", cache), "--quiet", "--concurrency", str(concurrency)]
        proc = subprocess.Popen(
            command, cwd=ROOT, env=_env(provider), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 120
        while len(_sent(provider)) < lines // 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        # the simulator logs a request when it has answered it; let the ones in flight finish
        time.sleep(1.0)
        before = Counter(_sent(provider))
        assert lines // 3 <= sum(before.values()) < lines

        summary = _run(provider, path, tmp_path / "resumed", cache, "--concurrency", str(concurrency))
        total = Counter(_sent(provider))

    hits = summary["cache"]["hits"]
    # every answer that reached this machine before the kill came from the cache, ...
    assert hits >= sum(before.values()) - concurrency
    assert summary["cache"]["misses"] == lines - hits
    # ... so no line went to the provider twice, but for the few in flight at the moment of the kill
    assert set(total) == {f"k-{n}" for n in range(lines)}
    assert sum(total.values()) == lines + (sum(before.values()) - hits)
    assert sum(1 for n in total.values() if n > 1) <= concurrency
    results = [orjson.loads(r) for r in (tmp_path / "resumed" / "long.results.jsonl").read_bytes().splitlines()]
    assert [r["custom_id"] for r in results] == [f"k-{n}" for n in range(lines)]


def test_cache_stats_and_clear(tmp_path: Path, capsys: Any) -> None:
    from sluice.cache.entries import CacheFill, DirStore
    from sluice.contract.model import Outcome, Request
    from sluice.core.records import result_record
    from sluice.providers import OPENAI

    from sluice_local.cli.app import main

    cache = tmp_path / "cache"
    fill = CacheFill(DirStore(cache), base_url="http://p/v1", name="seg", request_format=OPENAI)
    requests = [Request(n, f"c-{n}", "POST", "/v1/chat/completions", b'{"q":%d}' % (n % 3)) for n in range(1, 7)]
    for _ in fill.track(requests):
        pass
    for n in range(1, 7):
        outcome = Outcome(n, f"c-{n}", 200, {"choices": [{"finish_reason": "stop"}]}, f"r-{n}")
        fill.add(outcome, result_record("job", outcome))
    fill.close()

    assert main(["cache", "stats", "--cache-dir", str(cache), "--json"]) == 0
    stats = orjson.loads(capsys.readouterr().out)
    assert (stats["answers"], stats["requests"], stats["objects"]) == (6, 3, 2)
    # off a terminal, paid answers are deleted only when asked plainly
    assert main(["cache", "clear", "--cache-dir", str(cache)]) == 2
    assert "--yes" in capsys.readouterr().err
    assert main(["cache", "clear", "--cache-dir", str(cache), "--yes"]) == 0
    assert "removed 2 files" in capsys.readouterr().err
    assert main(["cache", "stats", "--cache-dir", str(cache)]) == 0
    assert "0 answers" in capsys.readouterr().out
