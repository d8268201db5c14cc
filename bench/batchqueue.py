"""Batch mode within the provider's enqueued-token limit: a job of 3x the limit.

The simulator enforces --limit input tokens enqueued at once for the model (OpenAI's Batch
queue limit: a batch that would pass it fails with `token_limit_exceeded`), and Sluice is
configured with the same limit. Another program on the same key holds --foreign-share of the
queue for the first --foreign-s seconds, which Sluice cannot know of, so the provider refuses
some of Sluice's batches: they must be created again, never end as failed lines, and leave no
file behind. The job's lines add up to --times the limit, in shards of --shard-lines.

Figures: lines, lines answered, lines in errors (target 0), batches created,
`token_limit_exceeded` seen, the peak enqueued tokens at the provider (the foreign batch's
included) against the limit, DynamoDB writes per line (all of the job's, and the queue
slots and hold rows alone), and the wall time.

    .venv/bin/python bench/batchqueue.py
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

import boto3  # noqa: E402
import botocore.client  # noqa: E402
import openai  # noqa: E402
import orjson  # noqa: E402

from sluice_local.cloud import REGION, LocalCloud, LocalSettings, run_job  # noqa: E402
from sluice_local.simulator import SimConfig, SimulatorServer  # noqa: E402

MODEL = "gpt-4o-mini"
URL = "/v1/chat/completions"
WRITES = {"PutItem", "UpdateItem", "DeleteItem"}


def body(n: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": f"Reply with one word, positive or negative: line {n} was great"}],
    }


def tokens(b: dict[str, Any]) -> int:
    return math.ceil(len(orjson.dumps(b)) / 4)


def _kind(key: Any) -> str:
    """The row a write went to, by its sort key: JOB, SHARD, ITEM, QUEUE (a queue slot), HOLD, ..."""
    sort_key = key.get("sk", {}) if isinstance(key, dict) else {}
    value = sort_key.get("S", "") if isinstance(sort_key, dict) else str(sort_key)
    return str(value).split("#", 1)[0] or "?"


class WriteCounter:
    """Every DynamoDB write of the run, counted at botocore (BatchWriteItem by its items), by row kind."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        self._original = botocore.client.BaseClient._make_api_call

    @property
    def writes(self) -> int:
        return sum(self.by_kind.values())

    def __enter__(self) -> WriteCounter:
        counter = self
        original = self._original

        def counted(client: Any, operation: str, params: dict[str, Any]) -> Any:
            if client.meta.service_model.service_name == "dynamodb":
                if operation in WRITES:
                    counter.by_kind[_kind(params.get("Key") or params.get("Item"))] += 1
                elif operation == "BatchWriteItem":
                    for requests in params.get("RequestItems", {}).values():
                        for request in requests:
                            put, delete = request.get("PutRequest", {}), request.get("DeleteRequest", {})
                            counter.by_kind[_kind(put.get("Item") or delete.get("Key"))] += 1
            return original(client, operation, params)

        self._patch = mock.patch.object(botocore.client.BaseClient, "_make_api_call", counted)
        self._patch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._patch.stop()


def foreign_batch(sim: SimulatorServer, share: float, limit: int) -> str:
    client = openai.OpenAI(base_url=sim.base_url, api_key="sk-bench-queue")
    rows: list[bytes] = []
    held = 0
    while held < share * limit:
        b = body(-len(rows) - 1)
        rows.append(
            orjson.dumps(
                {"custom_id": f"other-{len(rows)}", "method": "POST", "url": "/v1/chat/completions", "body": b}
            )
        )
        held += tokens(b)
    uploaded = client.files.create(file=("other.jsonl", b"\n".join(rows) + b"\n", "application/jsonl"), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h").id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=20_000, help="enqueued input tokens for the model")
    parser.add_argument("--times", type=float, default=3.0, help="the job's tokens as a multiple of the limit")
    parser.add_argument("--shard-lines", type=int, default=300)
    parser.add_argument("--map-concurrency", type=int, default=8)
    parser.add_argument("--phase", type=float, default=0.5, help="seconds per batch phase (3 phases a batch)")
    parser.add_argument("--foreign-share", type=float, default=0.5, help="share of the queue held by another program")
    parser.add_argument("--foreign-s", type=float, default=6.0, help="how long the other program's batch runs")
    args = parser.parse_args()

    per_line = tokens(body(0))
    lines = math.ceil(args.times * args.limit / per_line)
    settings = LocalSettings(
        # every run asks the provider: a cache filled by an earlier run would answer it instead
        cache="off",
        map_concurrency=args.map_concurrency,
        shard_lines=args.shard_lines,
        request_timeout_s=30.0,
        poll_seconds=1,
        batch_queue_tokens=f"{MODEL}={args.limit}",
    )
    with tempfile.TemporaryDirectory() as tmp, SimulatorServer(SimConfig(latency_s=0.0, seed=16)) as sim:
        path = Path(tmp) / "batchqueue.jsonl"
        path.write_bytes(
            b"".join(
                orjson.dumps({"custom_id": f"b-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body(n)})
                + b"\n"
                for n in range(lines)
            )
        )
        job_tokens = lines * per_line
        cloud = LocalCloud(provider_base_url=sim.base_url, api_key="sk-bench-queue", settings=settings)
        with cloud.running():
            sim.configure(
                batch_phase_s=args.phase,
                batch_queue_limit=args.limit,
                webhook_url=cloud.webhook_url,
                webhook_secret=cloud.webhook_secret,
            )
            foreign: list[str] = []
            lock = threading.Lock()

            def before(step: str, payload: dict[str, Any]) -> None:
                # the other program starts its batch just as the job's first shard submits
                with lock:
                    if step == "submit_batch" and not foreign and args.foreign_share > 0:
                        sim.configure(batch_phase_s=args.foreign_s / 3)
                        foreign.append(foreign_batch(sim, args.foreign_share, args.limit))
                        sim.configure(batch_phase_s=args.phase)

            cloud.before_invoke = before
            with WriteCounter() as counter:
                started = time.monotonic()
                run = run_job(cloud, path, metadata={"sluice-mode": "batch"})
                wall = time.monotonic() - started
            items = boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name).scan()["Items"]
            holds_left = sum(1 for i in items if str(i["sk"]).startswith("HOLD#") and "released" not in i)
        batches = sim.call(lambda s: [b for b in s.batches.values() if b.id not in foreign])
        refused_files_left = sim.call(lambda s: sum(1 for b in batches if b.errors and b.input_file_id in s.files))
        peak = sim.call(lambda s: s.batch_api.peak_enqueued.get(MODEL, 0))
        report = run.verify(path)
    refused = [b for b in batches if b.errors and b.errors[0]["code"] == "token_limit_exceeded"]
    codes = Counter(e["error"]["code"] for e in run.errors)
    rows = [
        (
            "job",
            f"{lines:,} lines of {per_line} tokens = {job_tokens:,} tokens = {job_tokens / args.limit:.2f}x the limit",
        ),
        ("status", run.status + ("" if report.ok else f" (verify failed: {report.describe()})")),
        ("lines answered", f"{len(run.results):,}"),
        ("lines in errors", f"{len(run.errors)}" + (f" {dict(codes)}" if codes else "")),
        ("batches created", f"{len(batches)} ({len(batches) - len(refused)} ran, {len(refused)} refused)"),
        ("token_limit_exceeded seen", f"{len(refused)}"),
        ("refused batches' files left", f"{refused_files_left}"),
        (
            "peak enqueued at the provider",
            f"{peak:,} of {args.limit:,} tokens ({peak / args.limit:.0%}; other program's included)",
        ),
        (
            "DynamoDB writes per line",
            f"{counter.writes / lines:.3f} ({counter.writes:,} writes: "
            + ", ".join(f"{kind} {n:,}" for kind, n in counter.by_kind.most_common())
            + f"); the queue's alone {(counter.by_kind['QUEUE'] + counter.by_kind['HOLD']) / lines:.4f}"
            + f" (its shared slots {counter.by_kind['QUEUE'] / lines:.4f})",
        ),
        ("queue holds left", f"{holds_left}"),
        ("wall time", f"{wall:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    print(
        f"Batch queue limit {args.limit:,} tokens for {MODEL}; shards of {args.shard_lines}; batch phase {args.phase} s"
    )
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    clean = not refused_files_left and not holds_left
    ok = report.ok and not run.errors and len(run.results) == lines and peak <= args.limit and clean
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
