"""Plan against a big response cache: one job's Plan, its peak memory and wall, the index synthetic.

    .venv/bin/python bench/cachescale.py --answers 100000000 --lines 1000000 --hits 0.1

Builds once, and keeps under out/bench/ (about 46 bytes an answer on disk), a published level-1
generation of `--answers` answers: random keys in every partition, plus a row for each line of
the job that the cache answers (`--hits`, a share of the lines, spread through the file), whose
answers are real result lines in segments of 5,000. Then runs `sluice.plan.plan.plan_job` on the job
in a fresh process, with the cache in that directory (`DirStore`) and the input in a file that
stands in for S3 (its GETs and ranged GETs, and the outputs Plan writes, counted and discarded).

Prints the Plan's wall and CPU, its peak RSS (`ru_maxrss`, what Lambda's memory limit counts)
and the RSS after imports, each phase's time (pass 1, lookups, the cut with the hits' fetch
and writes), and the cache's reads: requests and bytes, which on S3 cost what local disk does
not (a projection at the throughput assumed below is printed beside the measured wall). The
answers Plan writes go to /dev/null here; on S3 they are PUTs of the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "out" / "bench"
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

BASE_URL = "https://api.openai.com/v1"
# Plan's Lambda (contract.STEPS) and half of it: what the issue holds Plan to at the maximum
PLAN_MB = 3008
PLAN_TIMEOUT_S = 900
# a projection of the cache's reads on S3, not a measurement: requests in flight (Plan's lookup
# threads), the time to first byte of a GET, and a Lambda's throughput from S3, both assumed
S3_IN_FLIGHT = 16
S3_FIRST_BYTE_S = 0.03
S3_BYTES_PER_S = 100e6


def make_input(path: Path, lines: int) -> None:
    filler = "x" * 240
    with path.open("wb") as fh:
        for n in range(lines):
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"{n} {filler}"}]}
            row = {"custom_id": f"req-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            fh.write(orjson.dumps(row) + b"\n")


def hit(n: int, share: float) -> bool:
    """Whether the cache answers line `n` (0-based): spread through the file, not in one block."""
    return (n * 2654435761) % 1_000_000 < share * 1_000_000


def answer_record(n: int) -> bytes:
    body = {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer {n}"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 70, "completion_tokens": 3, "total_tokens": 73},
    }
    response = {"status_code": 200, "request_id": f"req_{n:012d}", "body": body}
    return orjson.dumps({"id": f"batch_req_{n}", "custom_id": f"req-{n}", "response": response, "error": None})


def build(where: Path, input_path: Path, *, answers: int, lines: int, share: float, fresh: bool) -> None:
    """The generation and the hits' segments, in `where` (a DirStore's root); with `fresh`, the
    hits' rows in level-0 indexes beside their segments, as the shards that got them wrote them."""
    from sluice.cache.blobs import DirStore
    from sluice.cache.entries import cache_key, line_tag
    from sluice.cache.index import (
        ROW,
        Manifest,
        SegmentTable,
        digits_for,
        index_bytes,
        manifest_name,
        partition_name,
        partition_of,
        partitions,
        segments_name,
    )
    from sluice.contract.model import Request
    from sluice.formats.lines import parse_line

    store = DirStore(where)
    digits = digits_for(answers)
    count = partitions(digits)
    # the job's answers: one row each, in segments of 5,000 result lines
    extra: dict[int, list[bytes]] = {p: [] for p in range(count)}
    # the random rows' segment: there (compaction keeps rows whose segment is listed), never read
    segments = ["segments/never-read.jsonl"]
    store.write(segments[0], b"")
    rows: list[bytes] = []
    level0: list[bytes] = []
    offset = hits = 0

    def write_segment() -> None:
        segments.append(f"segments/bench-{len(segments):06d}.jsonl")
        store.write(segments[-1], b"".join(rows))
        if fresh:
            name = segments[-1].removeprefix("segments/").removesuffix(".jsonl")
            store.write(f"index/{name}.idx", index_bytes(segments[-1:], ["gpt-4o-mini"], len(level0), b"".join(level0)))

    with input_path.open("rb") as fh:
        for n, raw in enumerate(fh):
            if not hit(n, share):
                continue
            request = parse_line(raw, n + 1, sort_keys=True)
            assert isinstance(request, Request)
            key = cache_key(BASE_URL, request.path, request.body, canonical=True)
            record = answer_record(n) + b"\n"
            rows.append(record)
            if fresh:
                level0.append(ROW.pack(key, line_tag(request.custom_id), 0, offset, len(record), 0, 70, 3))
            else:
                packed = ROW.pack(key, line_tag(request.custom_id), len(segments), offset, len(record), 0, 70, 3)
                extra[partition_of(key, digits)].append(packed)
            offset += len(record)
            hits += 1
            if len(rows) == 5000:
                write_segment()
                rows, level0, offset = [], [], 0
    if rows:
        write_segment()
    generation = "00000000000000000001-bench"
    kept = answers - (0 if fresh else hits)
    per = kept // count
    sizes: list[int] = []
    started = time.perf_counter()
    for p in range(count):
        packed = random_rows(p, digits, per + (1 if p < kept % count else 0))
        mine = sorted(extra[p])
        data = merge(packed, mine, ROW.size) if mine else packed
        store.write(partition_name(generation, p, digits), data)
        sizes.append(len(data) // ROW.size)
        if p % 256 == 255:
            print(f"  built {p + 1:,} of {count:,} partitions ({time.perf_counter() - started:.0f} s)", flush=True)
    # rows each segment has: what sizes the next generation a compaction makes
    if fresh:
        segments, counts = segments[:1], [kept]
    else:
        counts = [kept] + [5000] * (len(segments) - 2) + [hits - 5000 * (len(segments) - 2)]
    table = SegmentTable(segments, [int(time.time())] * len(segments), counts, ["gpt-4o-mini"])
    store.write(segments_name(generation), table.encode())
    store.write(manifest_name(generation), Manifest(generation, digits, sizes, [], time.time()).encode())


def random_rows(partition: int, digits: int, count: int) -> bytes:
    """`count` rows of random keys in `partition`, sorted, in the level-1 layout (segment 0)."""
    from sluice.cache.index import ROW

    keys = bytearray(os.urandom(16 * count))
    # the partition's leading hex digits, set a byte (or half of one) at a time across all keys
    bits = 4 * digits
    for byte in range((bits + 7) // 8):
        shift = bits - 8 * (byte + 1)
        if shift >= 0:
            keys[byte::16] = bytes([(partition >> shift) & 0xFF]) * count
        else:
            high = ((partition << -shift) & 0xFF, 0xFF >> (8 + shift))
            keys[byte::16] = keys[byte::16].translate(bytes(high[0] | (b & high[1]) for b in range(256)))
    ordered = b"".join(sorted(keys[at : at + 16] for at in range(0, len(keys), 16)))
    out = bytearray(ROW.size * count)
    for column in range(16):
        out[column::46] = ordered[column::16]
    tags = os.urandom(8 * count)
    for column in range(8):
        out[16 + column :: 46] = tags[column::8]
    return bytes(out)


def merge(rows: bytes, new: list[bytes], size: int) -> bytes:
    import bisect

    class Keys:
        def __len__(self) -> int:
            return len(rows) // size

        def __getitem__(self, i: int) -> bytes:
            return rows[i * size : i * size + 24]

    pieces, at = [], 0
    for row in new:
        place = bisect.bisect_left(Keys(), row[:24], at)
        pieces += [rows[at * size : place * size], row]
        at = place
    pieces.append(rows[at * size :])
    return b"".join(pieces)


def peak_rss_mb() -> float:
    """This process's peak resident memory. `ru_maxrss` would do but for a child's first moments:
    Linux carries the parent's peak into it across fork and exec; VmHWM is this process's own."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class FileS3:
    """The job's input in a file, as `plan_job` reads it from S3; what it writes, counted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.gets = self.ranged = self.puts = 0
        self.read_bytes = self.written = 0

    def head_object(self, **_: Any) -> dict[str, Any]:
        return {"Metadata": {}, "ContentLength": self.path.stat().st_size}

    def get_object(self, *, Range: str | None = None, **_: Any) -> dict[str, Any]:
        path = self.path
        counter = self

        class Body:
            def iter_chunks(self, size: int) -> Any:
                counter.gets += 1
                with path.open("rb") as fh:
                    while chunk := fh.read(size):
                        counter.read_bytes += len(chunk)
                        yield chunk

            def read(self) -> bytes:
                assert Range is not None
                start, end = map(int, Range.removeprefix("bytes=").split("-"))
                counter.ranged += 1
                with path.open("rb") as fh:
                    fh.seek(start)
                    data = fh.read(end + 1 - start)
                counter.read_bytes += len(data)
                return data

        return {"Body": Body()}

    def put_object(self, *, Body: bytes, **_: Any) -> None:
        self.puts += 1
        self.written += len(Body)


def child(args: argparse.Namespace) -> None:
    import sluice.plan.plan
    from sluice.cache.blobs import DirStore
    from sluice.contract import Settings

    class Counted(DirStore):
        reads = 0
        read_bytes = 0

        def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
            data = super().read(name, start, end)
            Counted.reads += 1
            Counted.read_bytes += len(data or b"")
            return data

    phases: dict[str, list[float]] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            started, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                wall, used, _ = phases.setdefault(name, [0.0, 0.0, 0.0])
                spent = [wall + time.perf_counter() - started, used + time.process_time() - cpu]
                phases[name] = [*spent, peak_rss_mb()]

        return wrapper

    sluice.plan.plan.cache_store = lambda s3, settings: Counted(Path(args.cache))  # type: ignore[assignment]
    sluice.plan.plan.read_lines = timed("pass 1 (validate, hash, keys)", sluice.plan.plan.read_lines)  # type: ignore[assignment]
    sluice.plan.plan.find_hits = timed("lookups", sluice.plan.plan.find_hits)  # type: ignore[assignment]
    sluice.plan.plan.cut_shards = timed("cut, hits fetched and written", sluice.plan.plan.cut_shards)  # type: ignore[assignment]
    sluice.plan.plan.CacheView.load = timed("cache view", sluice.plan.plan.CacheView.load)  # type: ignore[method-assign]
    view = sluice.plan.plan.CacheView
    view.read_level0 = timed("level 0 read", view.read_level0)  # type: ignore[method-assign]

    class NoStore:
        def claim_job(self, *_: Any, **__: Any) -> bool:
            return True

        def record_plan(self, *_: Any, **__: Any) -> None:
            return None

        def own_input(self, *_: Any, **__: Any) -> None:
            return None

    s3 = FileS3(Path(args.input))
    settings = Settings(
        bucket="bench",
        table="bench",
        provider_base_url=BASE_URL,
        api_key_secret_arn="arn",
        cache_dir=args.cache,
        cache="off" if args.no_cache else "on",
        shard_lines=args.shard_lines,
    )
    baseline = peak_rss_mb()
    cpu = time.process_time()
    started = time.perf_counter()
    state = sluice.plan.plan.plan_job(
        s3=s3,
        store=NoStore(),  # type: ignore[arg-type]
        settings=settings,
        bucket="bench",
        key="inbox/bench.jsonl",
        etag="etag",
        execution="bench",
    )
    wall = time.perf_counter() - started
    print(
        json.dumps(
            {
                "wall_s": wall,
                "cpu_s": time.process_time() - cpu,
                "rss_mb": peak_rss_mb(),
                "baseline_mb": baseline,
                "shards": state.shards,
                "phases": phases,
                "cache_reads": Counted.reads,
                "cache_bytes": Counted.read_bytes,
                "input_gets": s3.gets,
                "input_ranged": s3.ranged,
                "input_bytes": s3.read_bytes,
                "puts": s3.puts,
                "written": s3.written,
            }
        )
    )


def compact_child(args: argparse.Namespace) -> None:
    """Compaction of the index, with `--level0` new rows in level-0 indexes, a Merge's slice at a time."""
    from sluice.cache.blobs import DirStore
    from sluice.cache.compact import GRACE_S, SLICE_S, compact
    from sluice.cache.index import ROW, index_bytes

    class Counted(DirStore):
        moved = [0, 0, 0, 0]

        def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
            data = super().read(name, start, end)
            Counted.moved[0] += 1
            Counted.moved[1] += len(data or b"")
            return data

        def write(self, name: str, data: bytes) -> None:
            super().write(name, data)
            Counted.moved[2] += 1
            Counted.moved[3] += len(data)

    store = Counted(Path(args.cache))
    per = 5000
    for n in range(0, args.level0, per):
        count = min(per, args.level0 - n)
        keys = os.urandom(16 * count)
        rows = b"".join(ROW.pack(keys[i * 16 : i * 16 + 16], bytes(8), 0, 0, 100, 0, 0, 0) for i in range(count))
        # named anew each run: a name the newest generation holds would be taken for what it holds
        name = f"index/bench-new-{time.time_ns()}-{n // per:06d}.idx"
        store.write(name, index_bytes(["segments/never-read.jsonl"], ["m"], count, rows))
    slices = []
    now = time.time()
    while True:
        cpu, started = time.process_time(), time.perf_counter()
        done = compact(store, now=now, ttl_days=0, deadline=time.monotonic() + SLICE_S)
        slices.append((done.partitions, time.perf_counter() - started, time.process_time() - cpu))
        if done.published or not done.partitions:
            break
    collected = compact(store, now=now + GRACE_S, ttl_days=0, deadline=time.monotonic()).deleted
    reads, read, writes, written = Counted.moved
    moved = {"reads": reads, "read": read, "writes": writes, "written": written}
    print(json.dumps({"slices": slices, "rss_mb": peak_rss_mb(), "collected": collected, **moved}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=int, default=100_000_000, help="answers the cache's index holds")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--hits", type=float, default=0.1, help="share of the job's lines the cache answers")
    parser.add_argument("--shard-lines", type=int, default=5000)
    parser.add_argument("--first", type=int, default=0, metavar="N", help="plan a job of the first N lines only")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="the job's answers not compacted yet, in level-0 indexes: what a re-run right after its first run finds",
    )
    parser.add_argument("--no-cache", action="store_true", help="also plan the job with the cache off, to compare")
    parser.add_argument(
        "--compact",
        type=int,
        default=0,
        metavar="ROWS",
        help="then time compaction of the index with ROWS new answers in level 0, a Merge's slice at a time",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compact-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--level0", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.compact_child:
        compact_child(args)
        return
    WORK.mkdir(parents=True, exist_ok=True)
    input_path = WORK / f"cachescale-{args.lines}.jsonl"
    if not input_path.exists():
        make_input(input_path, args.lines)
    tag = hashlib.sha256(f"{args.answers}:{args.lines}:{args.hits}{':fresh' * args.fresh}".encode()).hexdigest()[:8]
    cache = WORK / f"cachescale-{args.answers}-{tag}"
    if not (cache / "index").is_dir():
        print(f"building a {args.answers:,}-answer index in {cache} (kept for the next run) ...", flush=True)
        started = time.perf_counter()
        build(cache, input_path, answers=args.answers, lines=args.lines, share=args.hits, fresh=args.fresh)
        print(f"  built in {time.perf_counter() - started:.0f} s", flush=True)
    from sluice.cache.blobs import DirStore
    from sluice.cache.lookup import CacheView
    from sluice.providers import OPENAI

    # what the index holds now: an earlier run's --compact added its answers to it
    answers = len(CacheView.load(DirStore(cache), now=time.time(), ttl_days=0, request_format=OPENAI))
    size = sum(p.stat().st_size for p in (cache / "index").rglob("*") if p.is_file())
    print(
        f"job: {args.lines:,} lines ({input_path.stat().st_size / 1e6:.0f} MB), {args.hits:.0%} answered by the cache; "
        f"index: {answers:,} answers, {size / 1e9:.2f} GB; shards of {args.shard_lines:,}; 2 cores, local disk"
    )
    runs = [("cache off", True)] if args.no_cache else []
    runs.append(("cache on", False))
    for label, off in runs:
        job = input_path
        if args.first:
            # a smaller job of the same lines: the index built for --lines serves it
            job = WORK / f"cachescale-{args.lines}-first-{args.first}.jsonl"
            with input_path.open("rb") as whole, job.open("wb") as part:
                part.writelines(itertools.islice(whole, args.first))
        command = [sys.executable, __file__, "--child", "--cache", str(cache), "--input", str(job)]
        command += ["--shard-lines", str(args.shard_lines), *(["--no-cache"] if off else [])]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{label}: Plan wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s; peak RSS {r['rss_mb']:.0f} MB "
            f"(after imports {r['baseline_mb']:.0f} MB); {r['shards']:,} shards"
        )
        for phase, (seconds, cpu, peak) in r["phases"].items():
            print(f"  {phase}: {seconds:.1f} s (CPU {cpu:.1f} s), peak RSS by its end {peak:.0f} MB")
        print(
            f"  cache: {r['cache_reads']:,} reads, {r['cache_bytes'] / 1e6:.0f} MB; input: {r['input_gets']} GET, "
            f"{r['input_ranged']:,} ranged GETs, {r['input_bytes'] / 1e6:.0f} MB; "
            f"{r['puts']:,} PUTs, {r['written'] / 1e6:.0f} MB written"
        )
        if not off:
            s3 = r["cache_reads"] * S3_FIRST_BYTE_S / S3_IN_FLIGHT + r["cache_bytes"] / S3_BYTES_PER_S
            print(
                f"  the cache's reads on S3, projected ({S3_IN_FLIGHT} in flight, {S3_FIRST_BYTE_S * 1000:.0f} ms "
                f"to first byte, {S3_BYTES_PER_S / 1e6:.0f} MB/s): about {s3:.0f} s, in place of the disk's"
            )
            print(
                f"  against Plan's Lambda: {r['rss_mb'] / PLAN_MB:.0%} of {PLAN_MB} MB (target < 1,500 MB at 1M lines; "
                f"<= 50% at the maximum), {r['wall_s'] / PLAN_TIMEOUT_S:.0%} of {PLAN_TIMEOUT_S} s"
            )
    if args.compact:
        from sluice.cache.compact import SLICE_S

        command = [sys.executable, __file__, "--compact-child", "--cache", str(cache), "--level0", str(args.compact)]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        walls = [wall for _, wall, _ in r["slices"]]
        print(
            f"compaction of {answers:,} answers and {args.compact:,} new: {len(walls)} slices of at most "
            f"{walls and max(walls):.0f} s, {sum(walls):.0f} s in all (CPU {sum(c for _, _, c in r['slices']):.0f} s); "
            f"partitions per slice {[p for p, _, _ in r['slices']]}; peak RSS {r['rss_mb']:.0f} MB; "
            f"{r['collected']:,} objects of the old generation and level 0 collected after the grace period"
        )
        s3 = (r["reads"] + r["writes"]) * S3_FIRST_BYTE_S / 8 + (r["read"] + r["written"]) / S3_BYTES_PER_S
        print(
            f"  {r['reads']:,} reads, {r['read'] / 1e9:.2f} GB; {r['writes']:,} writes, {r['written'] / 1e9:.2f} GB; "
            f"on S3, projected (8 in flight, as compaction runs them): about {s3:.0f} s of Merge's slices of "
            f"{SLICE_S:.0f} s"
        )


if __name__ == "__main__":
    main()
