"""A shard whose outputs pass the size at which they go up in pieces (UPLOAD_PIECE_BYTES, 8 MiB),
in every mode: a 20,000-line batch job's shards did, and the job failed with 0 results and 0
errors after every request was sent and paid for."""

from __future__ import annotations

from pathlib import Path

import boto3
import orjson
import pytest
from sluice.shard import assembly

from sluice_local.cloud import REGION, run_job
from tests.conftest import write_jsonl

MIB = 1 << 20
MODES = ("direct", "background", "batch")


def big_answer_lines(mode: str, count: int, answer_bytes: int) -> list[bytes]:
    """`count` lines whose answers are each about `answer_bytes`: embeddings of as many dimensions
    (a float is some 20 bytes of JSON), or, for background Responses, long instructions, which a
    response object carries back as OpenAI's does."""
    lines = []
    for n in range(count):
        if mode == "background":
            url = "/v1/responses"
            body: dict[str, object] = {
                "model": "gpt-4o-mini",
                "instructions": f"{n} " + "Answer plainly. " * (answer_bytes // 16),
                "input": f"Review {n}: the kettle is great",
            }
        else:
            url = "/v1/embeddings"
            body = {"model": "text-embedding-3-small", "input": f"review {n}", "dimensions": answer_bytes // 20}
        lines.append(orjson.dumps({"custom_id": f"big-{n}", "method": "POST", "url": url, "body": body}) + b"\n")
    return lines


@pytest.mark.parametrize(
    ("mode", "output_mib"),
    [
        ("direct", 7),
        *((mode, mib) for mode in MODES for mib in (9, 20)),
        # a minute and a half together: with the scale runs, last and alone
        *(pytest.param(mode, 100, marks=pytest.mark.scale) for mode in MODES),
    ],
)
def test_a_shards_outputs_past_the_piece_size_are_written_whole_in_input_order(
    make_cloud, simulator, tmp_path: Path, mode: str, output_mib: int
) -> None:
    count = 120
    answer_bytes = output_mib * MIB // count + 4096
    cloud = make_cloud(shard_lines=count, concurrency=40, poll_seconds=1)
    path = write_jsonl(tmp_path / "big.jsonl", big_answer_lines(mode, count, answer_bytes))

    run = run_job(cloud, path, metadata={"sluice-mode": mode})

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert [r["custom_id"] for r in run.results] == [f"big-{n}" for n in range(count)]
    assert run.errors == []
    (shard,) = run.summary["shards"]
    assert shard["mode"] == mode
    key = f"jobs/{run.job_id}/shards/00000/results.jsonl"
    written = cloud.read(key)
    assert len(written) > output_mib * MIB
    # one PUT under the piece size, a multipart upload (its ETag has the pieces' count) over it
    pieces = "-" in boto3.client("s3", region_name=REGION).head_object(Bucket=cloud.bucket, Key=key)["ETag"]
    assert pieces == (len(written) > assembly.UPLOAD_PIECE_BYTES)
