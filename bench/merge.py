"""Merge: server-side UploadPartCopy against download-concatenate-upload, on moto, in one run.

Counts S3 requests (every API call the client makes) and the bytes that pass through the
process (downloaded plus uploaded), which is what a Lambda pays for in time and memory.

    .venv/bin/python bench/merge.py --shards 20 --shard-mib 8
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

BUCKET = "bench"


class Meter:
    """Counts calls and body bytes through botocore's event hooks."""

    def __init__(self, client: object) -> None:
        self.calls = 0
        self.bytes_up = 0
        self.bytes_down = 0
        events = client.meta.events  # type: ignore[attr-defined]
        events.register("before-call.s3.*", self._before)
        events.register("after-call.s3.GetObject", self._after_get)

    def _before(self, params: dict, **_: object) -> None:
        self.calls += 1
        body = params.get("body")
        if isinstance(body, bytes | bytearray):
            self.bytes_up += len(body)

    def _after_get(self, http_response: object, **_: object) -> None:
        self.bytes_down += int(http_response.headers.get("content-length", 0))  # type: ignore[attr-defined]

    def reset(self) -> None:
        self.calls = self.bytes_up = self.bytes_down = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--shard-mib", type=float, default=8.0)
    args = parser.parse_args()
    # shard outputs are usually alike (same line count), with a short last one; a mixed set
    # exercises the seams where small outputs must be combined through the process
    scenarios = {
        "uniform": [args.shard_mib] * (args.shards - 1) + [1.0],
        "mixed": [1.0 if n % 4 == 0 else args.shard_mib for n in range(args.shards)],
    }
    for name, sizes in scenarios.items():
        run(name, sizes)


def run(scenario: str, sizes_mib: list[float]) -> None:

    os.environ.update(
        {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    )
    import boto3
    from moto import mock_aws
    from sluice.merge import concatenate

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        keys = []
        for n, mib in enumerate(sizes_mib):
            size = int(mib * (1 << 20))
            line = (f'{{"custom_id":"shard-{n}","pad":"' + "x" * 200 + '"}\n').encode()
            body = (line * (size // len(line) + 1))[:size]
            key = f"jobs/bench/shards/{n:05d}/results.jsonl"
            s3.put_object(Bucket=BUCKET, Key=key, Body=body)
            keys.append(key)
        total = sum(s3.head_object(Bucket=BUCKET, Key=k)["ContentLength"] for k in keys)
        meter = Meter(s3)

        meter.reset()
        started = time.perf_counter()
        moved = concatenate(s3, BUCKET, keys, "outbox/sluice.results.jsonl", content_type="application/jsonl")
        sluice = (meter.calls, meter.bytes_up + meter.bytes_down, time.perf_counter() - started, moved["parts"])

        meter.reset()
        started = time.perf_counter()
        data = b"".join(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys)
        s3.put_object(Bucket=BUCKET, Key="outbox/naive.results.jsonl", Body=data)
        naive = (meter.calls, meter.bytes_up + meter.bytes_down, time.perf_counter() - started, 1)

        a = s3.get_object(Bucket=BUCKET, Key="outbox/sluice.results.jsonl")["Body"].read()
        assert a == data, "server-side merge must produce the same bytes"

    print(f"{scenario}: {len(sizes_mib)} shard outputs, {total / (1 << 20):.0f} MiB in all; moto in-process")
    for name, (calls, through, wall, parts) in (("sluice", sluice), ("naive", naive)):
        print(
            f"{name:7s} requests {calls:4d}  bytes through the process {through / (1 << 20):8.1f} MiB  "
            f"parts {parts:3d}  wall {wall:5.2f} s"
        )
    print(
        f"bytes through: sluice/naive = {sluice[1] / naive[1]:.3f}   "
        f"requests: sluice/naive = {sluice[0] / naive[0]:.2f}   (identical output checked)\n"
    )


if __name__ == "__main__":
    main()
