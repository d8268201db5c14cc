"""Merge on moto: how shard outputs are stitched together, and what Merge and MarkFailed cost a job.

`concatenate` (the default): server-side UploadPartCopy against download-concatenate-upload, in
one run. `--job`: a synthetic job (shards of `--lines` lines, checkpoint parts of `--part-rows`
rows as a shard at 12.5 requests/s writes them) through Merge (every shard finished) and through
MarkFailed (some shards finished, some cut short, some never started); then MarkFailed projected
to 1M and 10M lines. Each S3 request is delayed by `--latency-ms`, as AWS's would be.

Counts S3 requests (every API call the client makes) and the bytes that pass through the
process (downloaded plus uploaded), which is what a Lambda pays for in time and memory.

    .venv/bin/python bench/merge.py --shards 20 --shard-mib 8
    .venv/bin/python bench/merge.py --job --shards 20 --unfinished 5 --not-started 5
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

BUCKET = "bench"
TABLE = "bench-jobs"

# what the projection assumes of AWS, as docs/capacity.md (bench/capacity.py) does
S3_REQUEST_S = 0.020  # a small S3 request, end to end
BYTES_PER_S = 90e6  # what one Lambda downloads and uploads a second
# botocore's own CPU for one small request on a full core, measured with GetObject against a
# local server; a Lambda has a full core at FULL_VCPU_MB, a share of one below
CPU_PER_REQUEST_S = 0.002
# the documented maximum: shards of 5,000 lines, parts every ~37 lines (12.5 requests/s, 3 s a part)
SHARD_LINES = 5_000
PART_ROWS = 37
IN_FLIGHT = (40, 1_000)  # shards running when the job fails: prod's map_concurrency, the capacity grid's top


class Meter:
    """Counts calls, their time and body bytes through botocore's event hooks, by operation and by
    what they touch (`attribute` names the shard a call works for, or None for the job's own), and
    delays each call by `latency_s`."""

    def __init__(self, client: object, attribute: Callable[[dict[str, Any]], str | None] | None = None) -> None:
        self.attribute = attribute or (lambda params: None)
        self.latency_s = 0.0
        self._lock = threading.Lock()
        self.reset()
        events = client.meta.events  # type: ignore[attr-defined]
        events.register("provide-client-params.s3.*", self._params)
        events.register("before-call.s3.*", self._before)
        events.register("after-call.s3.GetObject", self._after_get)
        events.register("after-call.s3.*", self._after)
        events.register("after-call-error.s3.*", self._after)
        self._local = threading.local()

    def _params(self, params: dict, model: Any, **_: object) -> None:
        self._local.who = self.attribute(params)
        self._local.op = model.name
        # the body as the caller gave it: by the time of the request botocore has wrapped it
        body = params.get("Body")
        self._local.up = len(body) if isinstance(body, bytes | bytearray) else 0

    def _before(self, **_: object) -> None:
        who, up = self._local.who, self._local.up
        with self._lock:
            self.calls += 1
            self.ops[self._local.op] += 1
            self.by[who] += 1
            self.bytes_up += up
            self.bytes_by[who] += up
        self._local.started = time.perf_counter()
        if self.latency_s:
            time.sleep(self.latency_s)

    def _after(self, **_: object) -> None:
        spent = time.perf_counter() - self._local.started
        with self._lock:
            self.seconds += spent

    def _after_get(self, http_response: object, **_: object) -> None:
        down = int(http_response.headers.get("content-length", 0))  # type: ignore[attr-defined]
        with self._lock:
            self.bytes_down += down
            self.bytes_by[getattr(self._local, "who", None)] += down

    def reset(self) -> None:
        self.calls = self.bytes_up = self.bytes_down = 0
        self.seconds = 0.0
        self.ops: Counter[str] = Counter()
        self.by: Counter[str | None] = Counter()
        self.bytes_by: Counter[str | None] = Counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--shard-mib", type=float, default=8.0)
    parser.add_argument("--job", action="store_true", help="Merge and MarkFailed on a synthetic job")
    parser.add_argument("--lines", type=int, default=SHARD_LINES, help="lines a shard (--job)")
    parser.add_argument("--part-rows", type=int, default=PART_ROWS, help="rows a checkpoint part (--job)")
    parser.add_argument("--unfinished", type=int, default=5, help="shards cut short by the failure (--job)")
    parser.add_argument("--not-started", type=int, default=5, help="shards that never ran (--job)")
    parser.add_argument("--latency-ms", type=float, default=S3_REQUEST_S * 1000, help="added to each S3 call")
    args = parser.parse_args()
    os.environ.update(
        {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    )
    if args.job:
        run_job(args)
        return
    # shard outputs are usually alike (same line count), with a short last one; a mixed set
    # exercises the seams where small outputs must be combined through the process
    scenarios = {
        "uniform": [args.shard_mib] * (args.shards - 1) + [1.0],
        "mixed": [1.0 if n % 4 == 0 else args.shard_mib for n in range(args.shards)],
    }
    for name, sizes in scenarios.items():
        run(name, sizes, args.latency_ms / 1000)


def run(scenario: str, sizes_mib: list[float], latency_s: float) -> None:
    import boto3
    from moto import mock_aws
    from sluice.merge.merge import concatenate

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
        meter.latency_s = latency_s

        meter.reset()
        started = time.perf_counter()
        moved = concatenate(s3, BUCKET, keys, "outbox/sluice.results.jsonl", content_type="application/jsonl")
        sluice = (meter.calls, meter.bytes_up + meter.bytes_down, time.perf_counter() - started, moved["parts"])

        meter.reset()
        started = time.perf_counter()
        data = b"".join(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys)
        s3.put_object(Bucket=BUCKET, Key="outbox/naive.results.jsonl", Body=data)
        naive = (meter.calls, meter.bytes_up + meter.bytes_down, time.perf_counter() - started, 1)

        meter.latency_s = 0.0
        a = s3.get_object(Bucket=BUCKET, Key="outbox/sluice.results.jsonl")["Body"].read()
        assert a == data, "server-side merge must produce the same bytes"

    print(
        f"{scenario}: {len(sizes_mib)} shard outputs, {total / (1 << 20):.0f} MiB in all; "
        f"{latency_s * 1000:g} ms added to each S3 request; moto in-process"
    )
    for name, (calls, through, wall, parts) in (("sluice", sluice), ("naive", naive)):
        print(
            f"{name:7s} requests {calls:4d}  bytes through the process {through / (1 << 20):8.1f} MiB  "
            f"parts {parts:3d}  wall {wall:5.2f} s"
        )
    print(
        f"bytes through: sluice/naive = {sluice[1] / naive[1]:.3f}   "
        f"requests: sluice/naive = {sluice[0] / naive[0]:.2f}   (identical output checked)\n"
    )


# --- a whole job -----------------------------------------------------------------------------

FINISHED, UNFINISHED, NOT_STARTED = "finished", "unfinished", "not started"


@dataclasses.dataclass
class Measured:
    what: str
    requests: int
    ops: Counter[str]
    bytes_through: int
    wall: float
    # the calls' own time, summed
    seconds: float
    # requests and bytes by the kind of shard they worked for; None: the job's own (concatenation, summary)
    by: dict[str | None, int]
    bytes_by: dict[str | None, int]

    @property
    def in_flight(self) -> float:
        """Requests in flight on average: their summed time over the wall."""
        return self.seconds / self.wall

    def line(self) -> str:
        ops = ", ".join(f"{op} {n:,}" for op, n in self.ops.most_common())
        return (
            f"{self.what:11s} requests {self.requests:6,d}  bytes through {self.bytes_through / 1e6:7.1f} MB  "
            f"wall {self.wall:6.2f} s  in flight {self.in_flight:4.1f}\n{'':12s}({ops})"
        )


class Job:
    """A job in moto: its input object, manifest, job row, and each shard's parts or outputs.

    `shard_inputs`: each shard's lines an object of its own, which its spec names, so that no
    object of the job is larger than a shard's (moto answers a ranged GET by reading the whole
    object: 10^7 lines are 4 GB a read). `finished_parts`: the parts of the shards that finished
    too, which neither Merge nor MarkFailed reads."""

    def __init__(
        self,
        s3: Any,
        store: Any,
        job_id: str,
        kinds: list[str],
        *,
        lines: int,
        part_rows: int,
        shard_inputs: bool = False,
        finished_parts: bool = True,
    ) -> None:
        import orjson
        from sluice.contract import Planned
        from sluice.contract.model import Outcome
        from sluice.core.records import outcome_record
        from sluice.providers import OPENAI
        from sluice.shard.frame import ShardSpec
        from sluice.shard.parts import write_outputs
        from sluice.shard.stats import Stats

        self.job_id, self.kinds = job_id, kinds
        key = f"inbox/{job_id}.jsonl"
        content = "x" * 300

        def rows(first: int, last: int) -> bytes:
            return b"".join(
                b'{"custom_id":"l-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini",'
                b'"messages":[{"role":"user","content":"%s"}]}}\n' % (n, content.encode())
                for n in range(first, last + 1)
            )

        etag = "" if shard_inputs else s3.put_object(Bucket=BUCKET, Key=key, Body=rows(1, lines * len(kinds)))["ETag"]
        self.specs: list[Any] = []
        offset = 0
        for index in range(len(kinds)):
            shard_rows = rows(index * lines + 1, (index + 1) * lines)
            size = len(shard_rows)
            shard_key, shard_etag, start = key, etag, offset
            if shard_inputs:
                shard_key, start = f"inbox/{job_id}/{index:05d}.jsonl", 0
                shard_etag = s3.put_object(Bucket=BUCKET, Key=shard_key, Body=shard_rows)["ETag"]
            self.specs.append(
                ShardSpec(
                    job_id=job_id,
                    shard=index,
                    bucket=BUCKET,
                    key=shard_key,
                    etag=shard_etag,
                    start=start,
                    end=start + size,
                    first_line=index * lines + 1,
                    lines=lines,
                    mode="direct",
                    concurrency=25,
                    max_attempts=3,
                )
            )
            offset += size
        manifest = f"jobs/{job_id}/manifest.json"
        s3.put_object(Bucket=BUCKET, Key=manifest, Body=orjson.dumps([dataclasses.asdict(s) for s in self.specs]))
        self.state = Planned(
            job_id=job_id,
            bucket=BUCKET,
            key=key,
            etag=etag,
            manifest_key=manifest,
            output_prefix=f"outbox/{job_id}",
            map_concurrency=len(kinds),
            duplicate=False,
        )
        store.claim_job(job_id, execution="bench", bucket=BUCKET, key=key, etag=etag, started_at=time.time())
        pad = "y" * 700
        for spec, kind in zip(self.specs, kinds, strict=True):
            if kind == NOT_STARTED:
                continue
            records = []
            part_stats = Stats()
            for line in range(spec.first_line, spec.first_line + spec.lines):
                body = {
                    "model": "gpt-4o-mini",
                    "choices": [{"message": {"role": "assistant", "content": pad}}],
                    "usage": {"prompt_tokens": 90, "completion_tokens": 160},
                }
                outcome = Outcome(line, f"l-{line}", 200, body, f"req-{line}", latency_s=2.0)
                records.append((line, outcome_record(job_id, outcome)))
                if len(records) <= part_rows:
                    part_stats.add_outcome(outcome, at=time.time(), path="direct", request_format=OPENAI)
            if kind == FINISHED:
                write_outputs(s3, BUCKET, spec.prefix, [r + b"\n" for _, r in records], [], Stats())
                if not finished_parts:
                    continue
            # a part's rows in the order they completed (not the input's), as a shard writes them
            stats_body = orjson.dumps(part_stats.to_dict())
            for seq, first in enumerate(range(0, len(records), part_rows), start=1):
                chunk = records[first : first + part_rows]
                chunk = chunk[1::2] + chunk[::2]
                base = f"{spec.prefix}part-00001-{seq:04d}"
                s3.put_object(Bucket=BUCKET, Key=base + ".stats.json", Body=stats_body)
                s3.put_object(Bucket=BUCKET, Key=base + ".tsv", Body=b"".join(b"%d\tr\t%s\n" % r for r in chunk))

    def attribute(self, params: dict[str, Any]) -> str | None:
        """The kind of shard a call works for, by its key (or, on the input, by its byte range);
        None for the job's own: its manifest and outputs, and the concatenation's ranged reads."""
        key = str(params.get("Key") or params.get("Prefix") or "")
        marker = f"jobs/{self.job_id}/shards/"
        if key.endswith(("results.jsonl", "errors.jsonl")) and "Range" in params:
            return None
        if key.startswith(marker):
            return self.kinds[int(key[len(marker) :].split("/", 1)[0])]
        if key == self.state.key and "Range" in params:
            start = int(str(params["Range"]).removeprefix("bytes=").split("-")[0])
            return next(self.kinds[s.shard] for s in self.specs if s.start == start)
        return None


def measure(what: str, meter: Meter, latency_s: float, call: Callable[[], Any]) -> Measured:
    meter.reset()
    meter.latency_s = latency_s
    started = time.perf_counter()
    call()
    wall = time.perf_counter() - started
    meter.latency_s = 0.0
    return Measured(
        what,
        meter.calls,
        Counter(meter.ops),
        meter.bytes_up + meter.bytes_down,
        wall,
        meter.seconds,
        dict(meter.by),
        dict(meter.bytes_by),
    )


def run_job(args: argparse.Namespace) -> None:
    import boto3
    from moto import mock_aws
    from sluice.contract import create_table_request
    from sluice.merge.mark_failed import mark_failed
    from sluice.merge.merge import merge_job
    from sluice.store.jobs import JobStore

    kinds = (
        [UNFINISHED] * args.unfinished
        + [NOT_STARTED] * args.not_started
        + [FINISHED] * (args.shards - args.unfinished - args.not_started)
    )
    # the failure cuts short the shards running then: the ones after the finished ones
    kinds = kinds[args.unfinished + args.not_started :] + kinds[: args.unfinished + args.not_started]
    latency_s = args.latency_ms / 1000
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        boto3.client("dynamodb", region_name="us-east-1").create_table(**create_table_request(TABLE))
        store = JobStore(boto3.resource("dynamodb", region_name="us-east-1").Table(TABLE), ttl_days=1)
        built = time.perf_counter()
        done = Job(s3, store, "bench-merge", [FINISHED] * args.shards, lines=args.lines, part_rows=args.part_rows)
        failed = Job(s3, store, "bench-failed", kinds, lines=args.lines, part_rows=args.part_rows)
        parts = -(-args.lines // args.part_rows)
        print(
            f"job: {args.shards} shards of {args.lines:,} lines, {parts} parts of {args.part_rows} rows a shard "
            f"({time.perf_counter() - built:.0f} s to build); {args.latency_ms:g} ms added to each S3 request; "
            "moto in-process"
        )

        meter = Meter(s3, done.attribute)
        merged = measure("Merge", meter, latency_s, lambda: merge_job(s3=s3, store=store, state=done.state))
        print(merged.line())
        meter.attribute = failed.attribute

        def fail() -> None:
            while True:
                failure = mark_failed(s3=s3, store=store, state=failed.state, error="States.TaskFailed", cause="")
                if failure.result.done:
                    return

        marked = measure("MarkFailed", meter, latency_s, fail)
        print(marked.line())
        counts = Counter(kinds)
        print(
            f"{'':12s}shards: {counts[FINISHED]} finished, {counts[UNFINISHED]} cut short, "
            f"{counts[NOT_STARTED]} never started"
        )
        project(marked, counts, args)


def project(marked: Measured, counts: Counter[str], args: argparse.Namespace) -> None:
    """MarkFailed at scale: what each kind of shard cost here, times how many there are; the
    job's own requests and bytes (the concatenation) grow with its lines. An invocation assembles
    for at most ASSEMBLY_SHARE of its time and runs again for the rest, reading the finished
    shards' figures each time; the merge has a call of its own after a long assembly."""
    from sluice.contract import FULL_VCPU_MB, STEPS
    from sluice.merge.mark_failed import ASSEMBLY_SHARE, MERGE_AFTER_SHARE

    step = STEPS["mark_failed"]
    cpu_s = CPU_PER_REQUEST_S * FULL_VCPU_MB / min(step.memory_mb, FULL_VCPU_MB)
    per_request_s = max(S3_REQUEST_S / marked.in_flight, cpu_s)
    budget_s = ASSEMBLY_SHARE * step.timeout_s
    print(
        f"\nprojected MarkFailed: {S3_REQUEST_S * 1000:g} ms a request over the {marked.in_flight:.1f} in flight "
        f"measured, at least {cpu_s * 1000:.1f} ms of CPU each at {step.memory_mb:,} MB; {BYTES_PER_S / 1e6:g} MB/s "
        f"through the Lambda; {budget_s:.0f} s of assembly an invocation, of its {step.timeout_s} s"
    )
    bench_lines = args.lines * args.shards
    # a shard's parts and bytes grow with its lines
    per_shard = SHARD_LINES / args.lines

    def cost(scale: dict[str, int]) -> tuple[float, float]:
        requests = sum(n * per_shard * marked.by.get(k, 0) / counts[k] for k, n in scale.items() if counts[k])
        through = sum(n * per_shard * marked.bytes_by.get(k, 0) / counts[k] for k, n in scale.items() if counts[k])
        return requests, through

    for lines in (1_000_000, 10_000_000):
        shards = lines // SHARD_LINES
        early = IN_FLIGHT[0]
        scenarios = [(f"{n:,} cut short, the rest finished", {FINISHED: shards - n, UNFINISHED: n}) for n in IN_FLIGHT]
        scenarios.append((f"{early} cut short, the rest never run", {UNFINISHED: early, NOT_STARTED: shards - early}))
        scenarios.append(("every shard cut short", {UNFINISHED: shards}))
        for label, scale in scenarios:
            if sum(scale.values()) != shards or min(scale.values()) < 0:
                continue
            read = cost({FINISHED: scale.get(FINISHED, 0)})
            assembly = cost({k: n for k, n in scale.items() if k != FINISHED})
            concat = (marked.by.get(None, 0) * lines / bench_lines, marked.bytes_by.get(None, 0) * lines / bench_lines)
            read_s, assembly_s, concat_s = (r * per_request_s + b / BYTES_PER_S for r, b in (read, assembly, concat))
            # a call that assembled past MERGE_AFTER_SHARE leaves the merge to the next
            if assembly_s <= MERGE_AFTER_SHARE * step.timeout_s:
                calls, longest = 1, read_s + assembly_s + concat_s
            else:
                calls = math.ceil(assembly_s / budget_s) + 1
                longest = read_s + max(min(assembly_s, budget_s), concat_s)
            requests = calls * read[0] + assembly[0] + concat[0]
            through = calls * read[1] + assembly[1] + concat[1]
            print(
                f"  {lines:>10,} lines, {label:38s} requests {requests:9,.0f}  through {through / 1e9:5.1f} GB  "
                f"{calls * read_s + assembly_s + concat_s:6.0f} s in {calls} call{'s' if calls > 1 else ' '}, "
                f"the longest {longest / step.timeout_s:4.0%} of the timeout"
            )


if __name__ == "__main__":
    main()
