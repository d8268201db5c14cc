"""What a local run holds does not grow with its lines: moto keeps the objects and rows in use, not
every version written; the built-in simulator's request log keeps the latest requests only; the
process's C heap keeps few malloc arenas."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import sys
import urllib.request
from typing import Any, cast

import boto3
import pytest
from moto import mock_aws
from moto.dynamodb.models.dynamo_type import Item
from moto.s3.models import FakeKey

import sluice_local.providers as local_providers
from sluice_local.heap import few_arenas
from sluice_local.moto_patches import untracked
from sluice_local.providers import provider


def _ask(base_url: str, key: str, custom_id: str) -> int:
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", "x-sluice-custom-id": custom_id},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return int(answer.status)


def test_the_run_simulator_logs_only_its_latest_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(local_providers, "RUN_LOG_LIMIT", 3)
    with provider("openai", 0.0) as (base_url, key, _label, simulator):
        assert simulator is not None
        assert [_ask(base_url, key, f"r-{n}") for n in range(5)] == [200] * 5
        logged = [entry["custom_id"] for entry in simulator.log]
    # every request was answered; the log of a million-line run stays three entries long
    assert logged == ["r-2", "r-3", "r-4"]


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None, reason="glibc's mallopt"
)
def test_a_run_caps_the_malloc_arenas() -> None:
    # glibc took the cap (a C library without mallopt says False, and the run goes on)
    assert few_arenas() is True


def test_moto_keeps_no_version_a_write_replaced() -> None:
    with mock_aws(), untracked():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="memory-test")
        table = boto3.resource("dynamodb", region_name="us-east-1").create_table(
            TableName="rows",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for n in range(200):
            s3.put_object(Bucket="memory-test", Key=f"part-{n % 4}", Body=f"body {n}".encode())
            table.put_item(Item={"pk": f"row-{n % 4}", "n": n})
        gc.collect()
        # moto alone keeps all 200 of each; the latest four are what a reader can still reach
        assert len(cast(Any, FakeKey).instances_tracked) == 4
        assert len(cast(Any, Item).instances_tracked) == 4
        assert s3.get_object(Bucket="memory-test", Key="part-3")["Body"].read() == b"body 199"
        assert table.get_item(Key={"pk": "row-3"})["Item"]["n"] == 199
