"""Checkpoint parts through their public API: what runs write, what resumes and merge read back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import orjson
import pytest
from moto import mock_aws
from sluice.contract import ShardStats, StateError
from sluice.lines import LineError
from sluice.model import ErrorCode, Outcome
from sluice.parts import PartWriter, assemble, assemble_outputs, load_checkpoint, part_keys, parts_stats, read_part
from sluice.shard import ShardSpec
from sluice.store import ItemState

from tests.conftest import request_line

BUCKET = "parts-test"


class RecordingStore:
    """The item rows and counters a writer checkpoints, kept in memory."""

    def __init__(self) -> None:
        self.progress: list[dict[str, Any]] = []

    def record_progress(self, job_id: str, shard: int, items: list[ItemState], **counts: Any) -> None:
        self.progress.append({"items": list(items), **counts})

    def settle_early(self, job_id: str, shard: int, items: list[ItemState]) -> int:
        return 0


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client


def shard_of(s3: Any, count: int) -> ShardSpec:
    data = b"".join(request_line(f"c-{n}") for n in range(1, count + 1))
    etag = s3.put_object(Bucket=BUCKET, Key="inbox/in.jsonl", Body=data)["ETag"]
    return ShardSpec(
        job_id="job-parts",
        shard=0,
        bucket=BUCKET,
        key="inbox/in.jsonl",
        etag=etag,
        start=0,
        end=len(data),
        first_line=1,
        lines=count,
        mode="direct",
        concurrency=4,
        max_attempts=2,
    )


def answer(line: int) -> Outcome:
    body = {"model": "gpt-4o-mini", "usage": {"prompt_tokens": 10, "completion_tokens": 2}}
    return Outcome(line, f"c-{line}", 200, body, f"req-{line}")


def failure(line: int) -> Outcome:
    return Outcome(line, f"c-{line}", 400, None, None, error_code=ErrorCode.PROVIDER_ERROR, error_message="HTTP 400")


def write_run(s3: Any, spec: ShardSpec, run: int, store: RecordingStore, *items: Outcome | LineError) -> None:
    writer = PartWriter(s3=s3, store=store, spec=spec, run=run, every=1)  # type: ignore[arg-type]
    for item in items:
        if isinstance(item, LineError):
            writer.add_invalid(item)
        else:
            writer.add_outcome(item)
    writer.flush(finished=False)


def test_a_resumed_run_sees_every_checkpointed_line_and_assembly_keeps_input_order(s3: Any) -> None:
    spec = shard_of(s3, 5)
    store = RecordingStore()
    write_run(s3, spec, 1, store, answer(3), answer(1))
    invalid = LineError(2, ErrorCode.INVALID_JSON, "line 2: not JSON", None)
    # a later run re-sent line 1 (its first outcome was checkpointed): the first one counts
    write_run(s3, spec, 2, store, invalid, failure(1), failure(4))

    keys = part_keys(s3, spec)
    assert [k.rsplit("/", 1)[-1] for k in keys] == [
        "part-00001-0001.tsv",
        "part-00001-0002.tsv",
        "part-00002-0001.tsv",
        "part-00002-0002.tsv",
        "part-00002-0003.tsv",
    ]
    assert [(line, kind) for line, kind, _ in read_part(s3, BUCKET, keys[0])] == [(3, b"r")]
    checkpoint = load_checkpoint(s3, spec)
    assert (checkpoint.done, checkpoint.runs) == ({1, 2, 3, 4}, 2)
    assert parts_stats(s3, spec).to_dict() == assemble(s3, spec).to_dict()

    results = s3.get_object(Bucket=BUCKET, Key=spec.results_key)["Body"].read().splitlines()
    errors = s3.get_object(Bucket=BUCKET, Key=spec.errors_key)["Body"].read().splitlines()
    assert [orjson.loads(r)["custom_id"] for r in results] == ["c-1", "c-3"]
    assert [orjson.loads(e)["line"] for e in errors] == [2, 4]
    figures = orjson.loads(s3.get_object(Bucket=BUCKET, Key=spec.stats_key)["Body"].read())
    assert (figures["result_lines"], figures["error_lines"]) == (2, 2)


def test_a_shards_stats_read_back_as_written_and_an_unknown_key_is_refused(s3: Any) -> None:
    spec = shard_of(s3, 2)
    write_run(s3, spec, 1, RecordingStore(), answer(1), failure(2))

    written = assemble_outputs(s3, spec)

    raw = s3.get_object(Bucket=BUCKET, Key=spec.stats_key)["Body"].read()
    assert orjson.dumps(written.to_json()) == raw
    assert ShardStats.from_dict(orjson.loads(raw)) == written
    assert (written.result_lines, written.error_lines) == (1, 1)
    with pytest.raises(StateError, match=r"stats\.json: unknown key.*stray"):
        ShardStats.from_dict({**orjson.loads(raw), "stray": 1})
    # a shard that finished before its stats carried the sizes: Merge HEADs its outputs instead
    unsized = {k: v for k, v in orjson.loads(raw).items() if not k.endswith("_bytes")}
    assert ShardStats.from_dict(unsized).results_bytes is None


def test_assembly_of_an_unfinished_shard_accounts_for_every_line(s3: Any) -> None:
    spec = shard_of(s3, 3)
    write_run(s3, spec, 1, RecordingStore(), answer(2))

    assemble(s3, spec, missing_code=ErrorCode.CANCELLED, missing_message="the job was cancelled")

    errors = [orjson.loads(e) for e in s3.get_object(Bucket=BUCKET, Key=spec.errors_key)["Body"].read().splitlines()]
    assert [(e["line"], e["error"]["code"], e["error"]["message"]) for e in errors] == [
        (1, ErrorCode.CANCELLED, "line 1: the job was cancelled"),
        (3, ErrorCode.CANCELLED, "line 3: the job was cancelled"),
    ]
    assert load_checkpoint(s3, spec).done == {2}  # assembly writes the shard's files, not parts
