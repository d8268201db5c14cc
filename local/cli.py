"""`sluice`: run a job on this machine, or start the provider simulator."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_INPUT = 3


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


@contextmanager
def provider(latency_s: float) -> Iterator[tuple[str, str, str]]:
    """The user's provider when OPENAI_BASE_URL and OPENAI_API_KEY are set, else the simulator."""
    base_url = os.environ.get("OPENAI_BASE_URL")
    api_key = os.environ.get("OPENAI_API_KEY")
    if base_url and api_key:
        yield base_url, api_key, f"provider: {base_url}"
        return
    from local.simulator import SimConfig, SimulatorServer

    with SimulatorServer(SimConfig(latency_s=latency_s)) as sim:
        yield sim.base_url, "sk-simulator", f"provider: built-in SIMULATOR at {sim.base_url} (not a real model)"


def _progress(total: int | None, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="req", disable=None if enabled else True, dynamic_ncols=True, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from local.cloud import LocalCloud, LocalSettings
    from sluice.plan import job_id_for

    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"no such file: {path}", EXIT_INPUT)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = LocalSettings(
        concurrency=args.concurrency,
        map_concurrency=args.map_concurrency,
        shard_lines=args.shard_lines,
        max_attempts=args.max_attempts,
        request_timeout_s=args.request_timeout,
    )
    metadata = {"sluice-mode": args.mode} if args.mode else {}
    started = time.monotonic()
    with provider(args.latency) as (base_url, api_key, label):
        print(label, file=sys.stderr)
        cloud = LocalCloud(provider_base_url=base_url, api_key=api_key, settings=settings)
        with cloud.running():
            key, etag = cloud.upload(path, metadata=metadata)
            job_id = job_id_for(cloud.bucket, key, etag)
            execution = cloud.start(cloud.object_created_event(key, etag), name=job_id)
            bar = _progress(None, not args.quiet)

            def tick() -> None:
                job = cloud.job(job_id) or {}
                if bar.total is None and job.get("requests") is not None:
                    bar.total = job["requests"]
                    bar.refresh()
                bar.update(int(job.get("done", 0)) + int(job.get("failed", 0)) - bar.n)

            final = cloud.wait(execution, on_tick=tick)
            tick()
            bar.close()
            stem = key.removeprefix("inbox/").removesuffix(".jsonl")
            written = []
            for kind, suffix in (("results", ".results.jsonl"), ("errors", ".errors.jsonl"), ("summary", ".summary.json")):
                try:
                    data = cloud.read(f"outbox/{stem}{suffix}")
                except Exception:  # noqa: BLE001 - a failed plan writes only the summary
                    continue
                target = out / f"{stem}{suffix}"
                target.write_bytes(data)
                written.append((kind, target))
    wall = time.monotonic() - started
    summary_path = out / f"{stem}.summary.json"
    summary = orjson.loads(summary_path.read_bytes()) if summary_path.exists() else {}
    counts = summary.get("counts", {})
    print(
        f"job {job_id}: {final['status']} in {wall:.1f} s — "
        f"{counts.get('results', 0)} results, {counts.get('errors', 0)} errors",
        file=sys.stderr,
    )
    if summary.get("error"):
        print(f"error: {summary['error']}", file=sys.stderr)
    for kind, target in written:
        print(f"{kind}: {target}")
    return EXIT_OK if final["status"] == "SUCCEEDED" else EXIT_JOB_FAILED


def simulator(args: argparse.Namespace) -> int:
    from local import simulator as sim

    argv = ["--host", args.host, "--port", str(args.port), "--latency", str(args.latency)]
    return int(sim.main(argv) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Push many LLM requests (OpenAI Batch JSONL) through an OpenAI-compatible provider.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "run",
        help="run a job on this machine (moto + the same state machine and Lambda code)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.dedent(
            """\
            Run FILE through the Sluice state machine locally: S3, DynamoDB and Step Functions
            are moto, in this process; the provider is OPENAI_BASE_URL/OPENAI_API_KEY if both
            are set, else the built-in simulator.

            example:
              sluice run examples/reviews.jsonl --out out
            """
        ),
    )
    p.add_argument("file", help="input JSONL in the OpenAI Batch input format")
    p.add_argument("--out", default="out", help="directory for results, errors and summary (default: out)")
    p.add_argument("--mode", choices=["direct", "background"], help="how shards talk to the provider (default: direct)")
    p.add_argument("--concurrency", type=int, default=1000, help="requests in flight for the whole job (default: 1000)")
    p.add_argument("--map-concurrency", type=int, default=10, help="shards running at once (default: 10)")
    p.add_argument("--shard-lines", type=int, default=5000, help="lines per shard (default: 5000)")
    p.add_argument("--max-attempts", type=int, default=6, help="attempts per request before it goes to errors")
    p.add_argument("--request-timeout", type=float, default=120.0, help="seconds per attempt (default: 120)")
    p.add_argument("--latency", type=float, default=0.05, help="simulator latency in seconds (default: 0.05)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)

    s = sub.add_parser(
        "simulator",
        help="start the provider simulator alone",
        description="Start the OpenAI-compatible provider SIMULATOR.\n\nexample:\n  sluice simulator --port 8000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--latency", type=float, default=0.05)
    s.set_defaults(func=simulator)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
