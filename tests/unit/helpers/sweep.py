"""What test_sweep.py and the tests beside it share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from moto import mock_aws
from sluice.merge.merge import load_manifest
from sluice.runners.direct import run_direct
from sluice.send.engine import make_session
from sluice.shard.frame import ShardContext, ShardSpec

from tests.conftest import request_line
from tests.unit.helpers.cancel import BUCKET, Aws
from tests.unit.helpers.engine import Scripted, serve


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Aws]:
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield Aws("http://127.0.0.1:9")


def shard(aws: Aws, ids: list[str]) -> ShardSpec:
    aws.settings = replace(aws.settings, shard_lines=len(ids), concurrency=8)
    state = aws.plan("inbox/sweep.jsonl", [request_line(cid) for cid in ids])
    (spec,) = load_manifest(aws.s3, BUCKET, state["manifest_key"])
    return spec


def run(
    aws: Aws, provider: Scripted, spec: ShardSpec, remaining_s: Callable[[], float] = lambda: 900.0
) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with serve(provider):
            settings = replace(aws.settings, provider_base_url=provider.base_url, retry_base_delay_s=0.001)
            ctx = ShardContext(aws.s3, aws.store, settings, "sk-test", remaining_s, make_session)
            return (await run_direct(ctx, spec)).to_dict()

    return asyncio.run(go())
