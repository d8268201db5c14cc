"""Checkpoint parts through their public API: what runs write, what resumes and merge read back."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Iterator
from typing import Any

import boto3
import orjson
import pytest
from botocore.config import Config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws
from sluice.contract import ShardStats, StateError
from sluice.contract.model import ErrorCode, Outcome
from sluice.formats.lines import LineError
from sluice.shard import assembly
from sluice.shard.assembly import assemble, assemble_outputs
from sluice.shard.frame import ShardSpec
from sluice.shard.parts import (
    PartWriter,
    load_checkpoint,
    part_keys,
    parts_stats,
    read_part,
)
from sluice.store.jobs import ItemState

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


def padded(line: int, pad: int) -> Outcome:
    body = {"model": "gpt-4o-mini", "text": "x" * pad, "usage": {"prompt_tokens": 10, "completion_tokens": 2}}
    return Outcome(line, f"c-{line}", 200, body, f"req-{line}")


def test_outputs_past_the_window_are_written_in_windows_read_again_by_ranges(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch shard's answers come in the provider's order, and may be far larger than what a step
    holds: past ASSEMBLY_WINDOW_BYTES the rows are read again by ranges, a window at a time, and the
    files go up in pieces, still in input order and the first outcome of a line winning."""
    monkeypatch.setattr(assembly, "ASSEMBLY_WINDOW_BYTES", 256 << 10)
    monkeypatch.setattr(assembly, "IN_FLIGHT_BYTES", 128 << 10)
    count = 3000
    spec = shard_of(s3, count)
    order = list(range(1, count + 1))
    random.Random(7).shuffle(order)
    store = RecordingStore()
    writer = PartWriter(s3=s3, store=store, spec=spec, run=1, every=400)  # type: ignore[arg-type]
    for line in order:
        writer.add_outcome(padded(line, 4000) if line % 7 else failure(line))
    writer.flush(finished=False)
    # a later run's copies of lines that already had an outcome count for nothing
    write_run(s3, spec, 2, store, failure(5), failure(6))

    written = assemble_outputs(s3, spec)

    results = s3.get_object(Bucket=BUCKET, Key=spec.results_key)["Body"].read()
    errors = s3.get_object(Bucket=BUCKET, Key=spec.errors_key)["Body"].read().splitlines()
    # over UPLOAD_PIECE_BYTES: a multipart upload
    etag = s3.head_object(Bucket=BUCKET, Key=spec.results_key)["ETag"]
    assert len(results) > assembly.UPLOAD_PIECE_BYTES and "-" in etag
    lines = [orjson.loads(r)["custom_id"] for r in results.splitlines()]
    assert lines == [f"c-{n}" for n in range(1, count + 1) if n % 7]
    assert [orjson.loads(e)["line"] for e in errors] == [n for n in range(1, count + 1) if n % 7 == 0]
    assert (written.result_lines, written.error_lines, written.results_bytes) == (len(lines), len(errors), len(results))


def test_an_assembly_holds_a_window_of_the_outputs_not_the_outputs(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """80 MB of answers, assembled within a 4 MiB window: the step holds a part of that, where it held
    every answer four times over (its parts, its rows, its lines and the file) and a 50,000-line batch
    shard's long answers would not fit a Lambda's memory. What it holds is the window's and moto's,
    some 21 MB whatever the outputs' size: at 40 MB of outputs, half was too close to it to say."""
    monkeypatch.setattr(assembly, "ASSEMBLY_WINDOW_BYTES", 4 << 20)
    monkeypatch.setattr(assembly, "IN_FLIGHT_BYTES", 2 << 20)
    # S3 takes pieces of 5 MiB at least; these are only measured
    monkeypatch.setattr(assembly, "UPLOAD_PIECE_BYTES", 1 << 20)
    count = 20_000
    spec = shard_of(s3, count)
    writer = PartWriter(s3=s3, store=RecordingStore(), spec=spec, run=1, every=1000)  # type: ignore[arg-type]
    for line in range(1, count + 1):
        writer.add_outcome(padded(line, 4000))
    writer.flush(finished=False)
    sent: list[int] = []

    class Outputs:
        """The bucket, but for the outputs written, which are only measured (moto would hold them)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(s3, name)

        def put_object(self, **call: Any) -> dict[str, Any]:
            sent.append(len(call["Body"]))
            return {}

        def create_multipart_upload(self, **call: Any) -> dict[str, Any]:
            return {"UploadId": "u"}

        def upload_part(self, **call: Any) -> dict[str, Any]:
            sent.append(len(call["Body"]))
            return {"ETag": "e"}

        def complete_multipart_upload(self, **call: Any) -> dict[str, Any]:
            return {}

    tracemalloc.start()
    try:
        written = assemble_outputs(Outputs(), spec)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert written.result_lines == count and written.results_bytes is not None
    assert written.results_bytes > 80_000_000 and sum(sent) > written.results_bytes
    assert peak < written.results_bytes / 2, f"held {peak:,} bytes for {written.results_bytes:,} of outputs"


def test_a_shard_that_never_ran_is_assembled_holding_a_few_bytes_a_line_not_its_records(
    s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MarkFailed assembles a shard that never ran from its input: each line an error. orjson gives
    every record it makes a 4 kB buffer, so records held until the file was written took 4 kB a line
    (a 50,000-line batch shard 200 MB, four shards at once); each is made as it is written."""
    monkeypatch.setattr(assembly, "UPLOAD_PIECE_BYTES", 1 << 20)
    count = 10_000
    spec = shard_of(s3, count)
    sent: list[int] = []

    class Outputs:
        """The bucket, but for the outputs written, which are only measured (moto would hold them)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(s3, name)

        def put_object(self, **call: Any) -> dict[str, Any]:
            sent.append(len(call["Body"]))
            return {}

        def create_multipart_upload(self, **call: Any) -> dict[str, Any]:
            return {"UploadId": "u"}

        def upload_part(self, **call: Any) -> dict[str, Any]:
            sent.append(len(call["Body"]))
            return {"ETag": "e"}

        def complete_multipart_upload(self, **call: Any) -> dict[str, Any]:
            return {}

    tracemalloc.start()
    try:
        written = assemble_outputs(Outputs(), spec, missing_code=ErrorCode.JOB_FAILED, missing_message="failed")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (written.result_lines, written.error_lines) == (0, count)
    assert peak < 1000 * count, f"held {peak:,} bytes for {count:,} lines"


# what the local cloud and a Lambda with checksums off send: the body as the caller gave it
UNCHECKSUMMED = Config(request_checksum_calculation="when_required")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(
        st.one_of(st.integers(0, 2000), st.integers(1 << 20, 5 << 20)),
        max_size=8,
    )
)
def test_an_upload_writes_what_it_is_given_whatever_its_size(s3: Any, sizes: list[int]) -> None:
    """One PUT under UPLOAD_PIECE_BYTES, pieces over it: on either side of it, and across several
    pieces, the object is the records given, a line each (8 MiB of a shard's outputs failed a job)."""
    client = boto3.client("s3", region_name="us-east-1", config=UNCHECKSUMMED)
    records = [bytes([65 + n % 26]) * size for n, size in enumerate(sizes)]
    upload = assembly._Upload(client, BUCKET, "outputs/property.jsonl")
    for record in records:
        upload.write(record)
    upload.close()

    written = client.get_object(Bucket=BUCKET, Key="outputs/property.jsonl")["Body"].read()
    assert written == b"".join(record + b"\n" for record in records)
    assert (upload.lines, upload.size) == (len(records), len(written))
    etag = client.head_object(Bucket=BUCKET, Key="outputs/property.jsonl")["ETag"]
    assert ("-" in etag) == (len(written) >= assembly.UPLOAD_PIECE_BYTES)


@pytest.mark.parametrize("mib", [8, 20, 100])
def test_a_shards_outputs_of_many_mib_are_assembled_whole(s3: Any, mib: int) -> None:
    """8, 20 and 100 MiB of a shard's answers through the assembly every mode ends with."""
    client = boto3.client("s3", region_name="us-east-1", config=UNCHECKSUMMED)
    count = 400
    spec = shard_of(s3, count)
    writer = PartWriter(s3=client, store=RecordingStore(), spec=spec, run=1, every=100)  # type: ignore[arg-type]
    for line in range(1, count + 1):
        writer.add_outcome(padded(line, (mib << 20) // (count - count // 50) + 100) if line % 50 else failure(line))
    writer.flush(finished=False)

    written = assemble_outputs(client, spec)

    results = client.get_object(Bucket=BUCKET, Key=spec.results_key)["Body"].read()
    assert len(results) > mib << 20 and written.results_bytes == len(results)
    assert [orjson.loads(r)["custom_id"] for r in results.splitlines()] == [
        f"c-{n}" for n in range(1, count + 1) if n % 50
    ]
    assert written.error_lines == count // 50
