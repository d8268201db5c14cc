"""Shared fixtures: the provider simulator and the local cloud (moto + in-process Lambdas)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from sluice.contract import PlanCache, PlanFigures

from sluice_local.cloud import LocalCloud, LocalSettings
from sluice_local.simulator import SimConfig, SimulatorServer

# what only runs in `make test`, never in `make check`: a job through the local cloud
CLOUD_DIRS = ("workflow", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name in CLOUD_DIRS or "make_cloud" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cloud)
        elif _under_moto(item):
            item.add_marker(pytest.mark.moto)


def _under_moto(item: pytest.Item) -> bool:
    """Whether the test's module, or the module of one of its fixtures, imports moto's `mock_aws`."""
    modules = [getattr(item, "module", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info is not None else ():
        modules += [sys.modules.get(getattr(d.func, "__module__", "")) for d in defs]
    return any(getattr(m, "mock_aws", None) is not None for m in modules)


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's `sluice run` (and its subprocesses) gets a response cache of its own, never the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimConfig(latency_s=0.01, seed=1)) as sim:
        yield sim


@pytest.fixture
def make_cloud(simulator: SimulatorServer) -> Iterator[object]:
    """Start a local cloud with settings of the test's choosing; one per test."""
    stack: list[object] = []

    def start(**settings: object) -> LocalCloud:
        options = {
            "concurrency": 50,
            "map_concurrency": 4,
            "shard_lines": 100,
            "request_timeout_s": 5.0,
            "retry_base_delay_s": 0.05,
            **settings,
        }
        cloud = LocalCloud(provider_base_url=simulator.base_url, api_key="sk-test", settings=LocalSettings(**options))  # type: ignore[arg-type]
        context = cloud.running()
        context.__enter__()
        stack.append(context)
        return cloud

    yield start
    for context in reversed(stack):
        context.__exit__(None, None, None)  # type: ignore[attr-defined]


def request_line(custom_id: str, text: str = "The kettle is great", url: str = "/v1/chat/completions") -> bytes:
    if url == "/v1/responses":
        body: dict[str, object] = {
            "model": "gpt-4o-mini",
            "input": f"Reply with one word, positive or negative:\n\n{text}",
        }
    elif url == "/v1/embeddings":
        body = {"model": "text-embedding-3-small", "input": text}
    else:
        body = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": f"Reply with one word, positive or negative:\n\n{text}"}],
        }
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + b"\n"


def write_jsonl(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def plan_figures(requests: int, *, mode: str = "direct", **changes: Any) -> PlanFigures:
    """What Plan records of a job of `requests` lines, none blank or invalid, as `record_plan` takes it."""
    figures = PlanFigures(
        lines=requests,
        requests=requests,
        invalid={},
        blank=0,
        bytes=requests * 200,
        shards=1,
        mode=mode,
        concurrency=4,
        max_error_rate=0.0,
        cache=PlanCache(mode="off", hits=0),
        plan_seconds=0.1,
    )
    return replace(figures, **changes)


def cancel_in_cloud(store: Any, job_id: str, base_url: str, api_key: str = "sk-test") -> Any:
    """`sluice cancel` of a job running in the local cloud, against the provider at `base_url`."""
    import boto3
    from sluice.runners.cancel import cancel_job

    from sluice_local.cloud import REGION

    return cancel_job(
        s3=boto3.client("s3", region_name=REGION),
        store=store,
        sfn=boto3.client("stepfunctions", region_name=REGION),
        job_id=job_id,
        provider=lambda: (base_url, api_key),
    )
