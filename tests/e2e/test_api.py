"""`sluice.run` and `sluice.arun`: a job on this machine from Python, through `sluice run`'s code,
handed back as a Job whose lines are read from its outputs in input order."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import sluice
from sluice.cache.entries import SEGMENTS

from sluice_local.simulator import SimConfig, SimulatorServer
from tests.conftest import request_line, write_jsonl


def requests(n: int, prefix: str = "r") -> list[dict[str, Any]]:
    return [orjson.loads(request_line(f"{prefix}-{i}", f"review {i}")) for i in range(n)]


def test_a_list_of_dicts_runs_and_its_results_come_back_in_input_order(tmp_path: Path) -> None:
    job = sluice.run(requests(40), out=tmp_path / "out", shard_lines=15, concurrency=8)

    assert job.status == "SUCCEEDED" and job.succeeded
    assert [r["custom_id"] for r in job.results()] == [f"r-{i}" for i in range(40)]
    assert all(r["response"]["status_code"] == 200 for r in job.results())
    assert list(job.errors()) == []
    assert job.summary["counts"]["results"] == 40 and job.summary["job_id"] == job.job_id
    # the outputs, named after the input (`name`, for dicts), are where `sluice run --out` puts them
    assert job.results_path == tmp_path / "out" / "requests.results.jsonl"
    assert job.report_path is not None and job.report_path.exists()
    assert orjson.loads(job.summary_path.read_bytes())["counts"] == job.summary["counts"]  # type: ignore[union-attr]


def test_arun_in_an_event_loop_a_job_with_failed_lines_is_a_status_not_an_exception(tmp_path: Path) -> None:
    lines = [request_line(f"p-{i}") for i in range(12)]
    lines[5] = b'{"custom_id": "p-5", "method": "GET"}\n'
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)

    async def main() -> sluice.Job:
        # the loop keeps turning while the job runs on its worker thread
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.create_task(tick())
        job = await sluice.arun(path, out=str(tmp_path / "out"), allow_invalid=True)
        ticker.cancel()
        assert ticks > 10
        return job

    job = asyncio.run(main())

    assert job.status == "COMPLETED_WITH_ERRORS"
    assert [r["custom_id"] for r in job.results()] == [f"p-{i}" for i in range(12) if i != 5]
    assert [(e["custom_id"], e["error"]["code"]) for e in job.errors()] == [("p-5", "invalid_method")]
    assert job.results_path == tmp_path / "out" / "mixed.results.jsonl"


@pytest.mark.parametrize(
    ("source", "options", "error", "message"),
    [
        ("missing.jsonl", {}, sluice.InputError, "no such file: missing.jsonl"),
        ([{"custom_id": "a", "method": "POST"}], {}, sluice.InputError, "1 invalid line(s) of 1"),
        ([{"custom_id": "a"}], {"colour": "red"}, sluice.UsageError, "unrecognized arguments: --colour red"),
        ([{"custom_id": "a"}], {"mode": "fast"}, sluice.UsageError, "argument --mode: invalid choice: 'fast'"),
        ({"custom_id": "a"}, {}, sluice.UsageError, "not one dict"),
        (
            requests(2),
            {"provider": "anthropic", "mode": "background"},
            sluice.UsageError,
            "--mode background: the anthropic provider has no background responses",
        ),
    ],
)
def test_what_the_command_refuses_raises_a_sluice_error_with_its_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: Any, options: dict[str, Any], error: type, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error) as raised:
        sluice.run(source, **options)
    assert isinstance(raised.value, sluice.SluiceError)
    assert message in str(raised.value)
    assert raised.value.code == {sluice.InputError: 3, sluice.UsageError: 2}[error]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_provider_that_cannot_be_reached_raises_a_provider_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(sluice.ProviderError) as raised:
        sluice.run(requests(2), out=tmp_path / "out")
    assert raised.value.code == 8 and "127.0.0.1:9" in str(raised.value)


def _answers_filed(cache: Path) -> int:
    folder = cache / SEGMENTS
    return sum(p.read_bytes().count(b"\n") for p in folder.iterdir()) if folder.is_dir() else 0


def _when_answered(cache: Path, then: Any) -> threading.Thread:
    """Call `then` once some answers are filed in the cache (the job is running, lines in flight)."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while _answers_filed(cache) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        then()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def slow_provider(monkeypatch: pytest.MonkeyPatch) -> Any:
    # answers take 0.2 to 2.2 s: some are in when the interrupt comes, others are still on their way
    with SimulatorServer(SimConfig(latency_s=0.2, jitter_s=2.0)) as provider:
        monkeypatch.setenv("OPENAI_BASE_URL", provider.base_url)
        yield provider


def _accounted(job: sluice.Job, n: int) -> None:
    results = [r["custom_id"] for r in job.results()]
    errors = [e["custom_id"] for e in job.errors()]
    assert results, "some answers were in before the interrupt"
    assert sorted(results + errors, key=lambda c: int(c.split("-")[1])) == [f"l-{i}" for i in range(n)]
    assert results == sorted(results, key=lambda c: int(c.split("-")[1]))
    assert {e["error"]["code"] for e in job.errors()} == {"cancelled"}


def test_ctrl_c_cancels_the_job_writes_its_outputs_and_raises_a_keyboard_interrupt(
    tmp_path: Path, slow_provider: Any
) -> None:
    cache = tmp_path / "cache"
    _when_answered(cache, lambda: os.kill(os.getpid(), signal.SIGINT))

    with pytest.raises(KeyboardInterrupt) as raised:
        sluice.run(requests(200, "l"), out=tmp_path / "out", cache_dir=cache, concurrency=20)

    assert isinstance(raised.value, sluice.JobInterrupted)
    job = raised.value.job
    assert job.status == "CANCELLED" and job.summary["status"] == "CANCELLED"
    _accounted(job, 200)
    # the handler of Ctrl-C is the one before the run again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_cancelling_an_arun_task_cancels_the_job_once_its_outputs_are_written(
    tmp_path: Path, slow_provider: Any
) -> None:
    cache = tmp_path / "cache"

    async def main() -> None:
        task = asyncio.create_task(
            sluice.arun(requests(200, "l"), name="long", out=tmp_path / "out", cache_dir=cache, concurrency=20)
        )
        loop = asyncio.get_running_loop()
        _when_answered(cache, lambda: loop.call_soon_threadsafe(task.cancel))
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())

    summary = orjson.loads((tmp_path / "out" / "long.summary.json").read_bytes())
    assert summary["status"] == "CANCELLED"
    job = sluice.Job(
        job_id=summary["job_id"],
        status=summary["status"],
        summary=summary,
        results_path=tmp_path / "out" / "long.results.jsonl",
        errors_path=tmp_path / "out" / "long.errors.jsonl",
        summary_path=None,
        report_path=None,
    )
    _accounted(job, 200)
