"""The simulator's quota mode as a provider would enforce it: a reference for the shared limiter.

Two clients against one API key with a quota of --rpm requests a minute:
  burst   --burst requests at once, no retries: how many the full bucket lets through.
  retry   --lines requests that must all succeed, --workers at a time, each waiting the
          429's retry-after-ms before trying again (what a shard without a shared limiter does).
It prints accepted and 429 counts and the achieved rate against the quota; the bucket
starts full, so the ideal for the retry client is (lines - rpm) / rpm minutes.

    .venv/bin/python bench/quota.py --rpm 1200 --burst 2400 --lines 2400 --workers 64
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

import aiohttp  # noqa: E402

from sluice_local.simulator import SimConfig, SimulatorServer  # noqa: E402

KEY = "sk-bench-quota"


def body(n: int) -> bytes:
    return (
        b'{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Reply with one word, '
        b"positive or negative: line " + str(n).encode() + b' was great"}]}'
    )


async def send(session: aiohttp.ClientSession, url: str, n: int) -> tuple[int, float]:
    """The status and the wait a 429 asks for (seconds)."""
    async with session.post(url, data=body(n), headers={"Content-Type": "application/json"}) as answer:
        await answer.read()
        wait_ms = answer.headers.get("retry-after-ms")
        return answer.status, float(wait_ms) / 1000 if wait_ms else 0.0


async def burst(url: str, count: int) -> tuple[Counter[int], float]:
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector, headers={"Authorization": f"Bearer {KEY}"}) as session:
        started = time.monotonic()
        answers = await asyncio.gather(*(send(session, url, n) for n in range(count)))
        return Counter(status for status, _ in answers), time.monotonic() - started


async def retrying(url: str, lines: int, workers: int) -> tuple[Counter[int], float]:
    statuses: Counter[int] = Counter()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(lines):
        queue.put_nowait(n)
    connector = aiohttp.TCPConnector(limit=workers)
    async with aiohttp.ClientSession(connector=connector, headers={"Authorization": f"Bearer {KEY}"}) as session:

        async def worker() -> None:
            while not queue.empty():
                n = queue.get_nowait()
                while True:
                    status, wait = await send(session, url, n)
                    statuses[status] += 1
                    if status != 429:
                        break
                    await asyncio.sleep(wait)

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(workers)))
        return statuses, time.monotonic() - started


def report(label: str, statuses: Counter[int], wall: float, rpm: int, ideal: float | None = None) -> None:
    attempts = sum(statuses.values())
    accepted, limited = statuses[200], statuses[429]
    other = attempts - accepted - limited
    rate = accepted / wall * 60 if wall > 0 else float("inf")
    line = (
        f"{label:6} {attempts:6,} attempts  {accepted:6,} accepted  {limited:6,} 429 ({limited / attempts:.1%})"
        f"  {wall:6.1f} s  {rate:8,.0f} accepted/min = {rate / rpm:.2f}x the quota"
    )
    if accepted > rpm and wall > 0:
        # after the bucket's first fill, the server can grant at most rpm a minute
        sustained = (accepted - rpm) / wall * 60
        line += f"  beyond the first bucket {sustained:,.0f}/min = {sustained / rpm:.2f}x"
    if ideal is not None:
        line += f"  ideal {ideal:.1f} s -> {wall / ideal:.2f}x" if ideal > 0 else ""
    if other:
        line += f"  other statuses {dict((s, c) for s, c in statuses.items() if s not in (200, 429))}"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rpm", type=int, default=1200, help="the key's quota, requests a minute")
    parser.add_argument("--tpm", type=int, default=0, help="the key's quota, tokens a minute (0: none)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per answer")
    parser.add_argument("--burst", type=int, default=2400, help="requests sent at once (0: skip)")
    parser.add_argument("--lines", type=int, default=2400, help="requests the retry client must get answered (0: skip)")
    parser.add_argument("--workers", type=int, default=64, help="the retry client's requests in flight")
    args = parser.parse_args()

    config = SimConfig(latency_s=args.latency, quota_rpm=args.rpm, quota_tpm=args.tpm)
    print(f"quota {args.rpm:,} RPM{f', {args.tpm:,} TPM' if args.tpm else ''} per key; latency {args.latency} s")
    if args.burst:
        with SimulatorServer(config) as sim:
            statuses, wall = asyncio.run(burst(f"{sim.base_url}/chat/completions", args.burst))
        report("burst", statuses, wall, args.rpm)
    if args.lines:
        with SimulatorServer(config) as sim:
            statuses, wall = asyncio.run(retrying(f"{sim.base_url}/chat/completions", args.lines, args.workers))
        report("retry", statuses, wall, args.rpm, ideal=max(0.0, (args.lines - args.rpm) / args.rpm * 60))


if __name__ == "__main__":
    main()
