"""Plan throughput and memory against a naive reference, on the same S3 object in one run.

moto runs as a server in its own process, so each planner's peak RSS is its own and not the
stored object's. Each planner runs in a fresh subprocess.

    .venv/bin/python bench/plan.py --lines 100000 --line-bytes 2000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# generated inputs and profiles: under out/, which git ignores
WORK = ROOT / "out" / "bench"
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

BUCKET = "bench"
KEY = "inbox/big.jsonl"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_server(patches: str = "", env: dict[str, str] | None = None) -> Iterator[str]:
    """S3 and DynamoDB in a process of their own, so that what they hold is not the measured step's;
    `patches`, a module under ROOT the server imports first, and `env`, its environment's additions."""
    import boto3

    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; {f'import {patches}; ' if patches else ''}from moto.server import ThreadedMotoServer as S; "
            f"s = S(ip_address='127.0.0.1', port={port}); s.start(); time.sleep(86400)",
        ],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    )
    try:
        for _ in range(100):
            try:
                boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").list_buckets()
                break
            except Exception:
                time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        server.wait()


def make_input(path: Path, lines: int, line_bytes: int) -> None:
    filler = "x" * max(0, line_bytes - 160)
    with path.open("w") as fh:
        for n in range(lines):
            row = {
                "custom_id": f"req-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"{n} {filler}"}]},
            }
            fh.write(json.dumps(row) + "\n")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(variant: str, endpoint: str, shard_lines: int) -> None:
    import boto3

    os.environ["AWS_ENDPOINT_URL"] = endpoint
    s3 = boto3.client("s3", region_name="us-east-1")
    table = boto3.resource("dynamodb", region_name="us-east-1").Table("bench")
    head = s3.head_object(Bucket=BUCKET, Key=KEY)
    baseline = rss_mb()
    started = time.perf_counter()
    cpu0 = time.process_time()
    if variant == "sluice":
        from sluice.contract import Settings
        from sluice.plan.plan import plan_job
        from sluice.store.jobs import JobStore

        settings = Settings(
            bucket=BUCKET, table="bench", provider_base_url="http://x", api_key_secret_arn="x", shard_lines=shard_lines
        )
        out = plan_job(
            s3=s3,
            store=JobStore(table, ttl_days=1),
            settings=settings,
            bucket=BUCKET,
            key=KEY,
            etag=head["ETag"],
            execution=f"bench-{time.time_ns()}",
        )
        shards = out.shards
    else:
        # the obvious way: read it all, parse every line, write each shard as its own object
        data = s3.get_object(Bucket=BUCKET, Key=KEY)["Body"].read()
        rows = [json.loads(line) for line in data.splitlines() if line.strip()]
        seen: set[str] = set()
        for row in rows:
            seen.add(row["custom_id"])
        shards = 0
        for start in range(0, len(rows), shard_lines):
            chunk = "".join(json.dumps(r) + "\n" for r in rows[start : start + shard_lines])
            s3.put_object(Bucket=BUCKET, Key=f"jobs/naive/shard-{shards}.jsonl", Body=chunk.encode())
            shards += 1
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "variant": variant,
                "wall_s": wall,
                "cpu_s": time.process_time() - cpu0,
                "mb": head["ContentLength"] / 1e6,
                "rss_mb": rss_mb(),
                "baseline_rss_mb": baseline,
                "shards": shards,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--line-bytes", type=int, default=2000)
    parser.add_argument("--shard-lines", type=int, default=5000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.endpoint, args.shard_lines)
        return

    import boto3

    with moto_server() as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        boto3.client("dynamodb", endpoint_url=endpoint, region_name="us-east-1").create_table(
            TableName="bench",
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        )
        WORK.mkdir(parents=True, exist_ok=True)
        path = WORK / "plan-input.jsonl"
        make_input(path, args.lines, args.line_bytes)
        s3.upload_file(str(path), BUCKET, KEY)
        size_mb = path.stat().st_size / 1e6
        path.unlink()
        print(
            f"input: {args.lines:,} lines, {size_mb:.0f} MB, shards of {args.shard_lines} lines; 2 cores; moto server"
        )
        results = {}
        for variant in ("naive", "sluice"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    variant,
                    "--endpoint",
                    endpoint,
                    "--shard-lines",
                    str(args.shard_lines),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        for name, r in results.items():
            print(
                f"{name:7s} wall {r['wall_s']:6.2f} s  {r['mb'] / r['wall_s']:7.1f} MB/s  cpu {r['cpu_s']:6.2f} s  "
                f"peak RSS {r['rss_mb']:6.1f} MB (after imports {r['baseline_rss_mb']:5.1f} MB, "
                f"growth {r['rss_mb'] - r['baseline_rss_mb']:6.1f} MB)  shards {r['shards']}"
            )
        ratio = results["naive"]["wall_s"] / results["sluice"]["wall_s"]
        print(f"throughput sluice/naive: {ratio:.2f}x   (target >= 3x)")
        growth = results["sluice"]["rss_mb"] - results["sluice"]["baseline_rss_mb"]
        print(f"sluice RSS growth while planning: {growth:.1f} MB   (target < 64 MB + one 1 MiB read buffer)")


if __name__ == "__main__":
    main()
