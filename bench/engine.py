"""Benchmark: Sluice's fan-out engine against the two reference client patterns.

Not a test. Starts bench/refserver.py in its own process, then runs each client in its
own fresh subprocess so peak RSS and CPU time are that client's alone:

  a  sference guide: AsyncOpenAI + DefaultAioHttpClient, Semaphore(C), gather over all
  b  KiosAPI guide: one aiohttp session, TCPConnector(limit=C), Semaphore(C), gather, resp.json()
  c  Sluice fan_out with a shard's bookkeeping: running summary + one output JSONL line each

    python bench/engine.py                       # a,b,c at C=1000, L=1s, N=10000
    python bench/engine.py --faults              # same, provider injects 429s and 500s
    python bench/engine.py --mode scale          # c at N=10k vs N=100k: RSS ratio
    python bench/engine.py --mode faults         # c with vs without faults: throughput, lost lines
    python bench/engine.py --mode all
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL = "bench-model"
sys.path.insert(0, str(ROOT / "functions"))

# Imported before the clock starts: each client is timed on its requests, not on loading
# its library (openai, which loads its aiohttp transport with it, takes about a second).
PRELOAD = {"a": "openai", "b": "aiohttp", "c": "sluice.send.engine"}


def prompt(i: int) -> str:
    return f"Reply with one word, positive or negative:\n\nReview #{i}: the product arrived on time and works."


def raise_fd_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def usage() -> tuple[float, int]:
    """(CPU seconds user+sys, peak RSS KiB) of this process so far."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss


async def client_openai(base_url: str, n: int, concurrency: int) -> dict[str, Any]:
    from openai import AsyncOpenAI, DefaultAioHttpClient

    ok = failed = 0
    async with AsyncOpenAI(base_url=base_url, api_key="sk-bench", http_client=DefaultAioHttpClient()) as client:
        sem = asyncio.Semaphore(concurrency)

        async def submit(i: int) -> Any:
            async with sem:
                return await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": prompt(i)}],
                    max_tokens=16,
                )

        results = await asyncio.gather(*(submit(i) for i in range(n)), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                failed += 1
            else:
                ok += 1
    return {"ok": ok, "failed": failed, "lines": ok + failed}


async def client_aiohttp(base_url: str, n: int, concurrency: int) -> dict[str, Any]:
    import aiohttp

    url = base_url + "/chat/completions"
    ok = failed = 0

    async def create_completion(session: aiohttp.ClientSession, p: str) -> str:
        headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
        payload = {"model": MODEL, "messages": [{"role": "user", "content": p}]}
        async with session.post(url, headers=headers, json=payload) as resp:
            data = await resp.json()
            return str(data["choices"][0]["message"]["content"])

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        semaphore = asyncio.Semaphore(concurrency)

        async def bounded_completion(p: str) -> str:
            async with semaphore:
                return await create_completion(session, p)

        tasks = [bounded_completion(prompt(i)) for i in range(n)]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                failed += 1
            else:
                ok += 1
    return {"ok": ok, "failed": failed, "lines": ok + failed}


@dataclass(slots=True)
class Summary:
    """What a shard keeps while it runs: counters and a fixed-size latency histogram."""

    ok: int = 0
    failed: int = 0
    attempts: int = 0
    throttled: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    # 10 ms buckets up to 2 minutes: percentiles without keeping every latency
    latency_ms_buckets: list[int] | None = None

    def add(self, outcome: Any) -> None:
        if self.latency_ms_buckets is None:
            self.latency_ms_buckets = [0] * 12_001
        if outcome.error_code is None:
            self.ok += 1
            body = outcome.body
            use = body.get("usage") if isinstance(body, dict) else None
            if use:
                self.tokens_in += use.get("prompt_tokens", 0)
                self.tokens_out += use.get("completion_tokens", 0)
        else:
            self.failed += 1
        self.attempts += outcome.attempts
        self.throttled += outcome.throttled
        self.latency_ms_buckets[min(12_000, int(outcome.latency_s * 100))] += 1

    def percentile(self, q: float) -> float:
        buckets = self.latency_ms_buckets or [0]
        target = q * sum(buckets)
        seen = 0
        for i, count in enumerate(buckets):
            seen += count
            if seen >= target and count:
                return i / 100
        return 0.0


async def client_sluice(base_url: str, n: int, concurrency: int) -> dict[str, Any]:
    import orjson
    from sluice.contract.model import Outcome, Request
    from sluice.send.engine import EngineSettings, fan_out, make_session

    summary = Summary()
    out = tempfile.TemporaryFile()  # noqa: SIM115 - lives for the whole run
    write = out.write
    dumps = orjson.dumps

    def sink(o: Outcome) -> None:
        summary.add(o)
        if o.error_code is None:
            response: Any = {"status_code": o.status_code, "request_id": o.request_id, "body": o.body}
            error: Any = None
        else:
            response = None
            error = {"code": o.error_code, "message": o.error_message}
        write(
            dumps(
                {"id": f"sluice_req_{o.line}", "custom_id": o.custom_id, "response": response, "error": error},
                option=orjson.OPT_APPEND_NEWLINE,
            )
        )

    def requests() -> Iterator[Request]:
        for i in range(n):
            body = dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt(i)}]})
            yield Request(line=i + 1, custom_id=f"req-{i}", method="POST", path="/v1/chat/completions", body=body)

    async with make_session(concurrency) as session:
        stats = await fan_out(
            requests(),
            session=session,
            settings=EngineSettings(concurrency=concurrency, base_url=base_url, api_key="sk-bench"),
            sink=sink,
        )
    out.flush()
    return {
        "ok": summary.ok,
        "failed": summary.failed,
        "retries": stats.retries,
        "throttled": stats.throttled_429,
        "limit_min": stats.limit_min,
        "p50": summary.percentile(0.5),
        "p99": summary.percentile(0.99),
        "_out": out,
    }


def count_lines(out: Any, n: int) -> tuple[int, int]:
    """(distinct custom_ids written, lines lost) — checked after the clock stops."""
    import orjson

    out.seek(0)
    seen = {orjson.loads(line)["custom_id"] for line in out}
    expected = {f"req-{i}" for i in range(n)}
    return len(seen), len(expected - seen)


CLIENTS = {"a": client_openai, "b": client_aiohttp, "c": client_sluice}
NAMES = {"a": "a: openai+aiohttp (sference guide)", "b": "b: aiohttp+gather (KiosAPI guide)", "c": "c: sluice fan_out"}


def run_client_here(kind: str, base_url: str, n: int, concurrency: int) -> None:
    raise_fd_limit()
    importlib.import_module(PRELOAD[kind])
    cpu0, rss0 = usage()
    t0 = time.perf_counter()
    result = asyncio.run(CLIENTS[kind](base_url, n, concurrency))
    wall = time.perf_counter() - t0
    cpu1, rss1 = usage()
    out = result.pop("_out", None)
    if out is not None:
        result["lines"], result["lost"] = count_lines(out, n)
    result.update(wall_s=wall, cpu_s=cpu1 - cpu0, rss_start_kb=rss0, rss_peak_kb=rss1)
    print("RESULT " + json.dumps(result), flush=True)


class RefServer:
    def __init__(self, latency: float, faults: bool) -> None:
        cmd = [sys.executable, str(HERE / "refserver.py"), "--latency", str(latency)]
        if faults:
            cmd.append("--faults")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"refserver did not start: {line!r}")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}/v1"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_fresh(kind: str, n: int, concurrency: int, latency: float, with_faults: bool) -> dict[str, Any]:
    """One client run against its own fresh server: faults hit first attempts only, so a
    server that has already seen a request would spare it the second time round."""
    server = RefServer(latency, with_faults)
    try:
        return run_client(kind, server.base_url, n, concurrency)
    finally:
        server.close()


def run_client(kind: str, base_url: str, n: int, concurrency: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_client",
        kind,
        "--_url",
        base_url,
        "--n",
        str(n),
        "--concurrency",
        str(concurrency),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise RuntimeError(f"client {kind} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def describe(kind: str, r: dict[str, Any], n: int, concurrency: int, latency: float) -> dict[str, float]:
    ideal = n * latency / concurrency
    fig = {
        "wall": r["wall_s"],
        "ideal_frac": ideal / r["wall_s"],
        "cpu_ms": 1000 * r["cpu_s"] / n,
        "rss_mb": r["rss_peak_kb"] / 1024,
    }
    extra = ""
    if "lost" in r:
        extra = f"  retries={r['retries']} 429s={r['throttled']} lost={r['lost']} p50={r['p50']}s p99={r['p99']}s"
    print(
        f"{NAMES[kind]:<38} wall {fig['wall']:7.2f}s  {100 * fig['ideal_frac']:6.1f}% of ideal  "
        f"cpu {fig['cpu_ms']:6.3f} ms/req  peak RSS {fig['rss_mb']:7.1f} MB  "
        f"ok={r['ok']} failed={r['failed']}{extra}",
        flush=True,
    )
    return fig


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the shortest wall: on a shared 2-core box, noise only ever adds time."""
    return min(runs, key=lambda r: r["wall_s"])


def compare(args: argparse.Namespace) -> None:
    print(
        f"# compare: N={args.n} C={args.concurrency} L={args.latency}s faults={args.faults} "
        f"ideal wall {args.n * args.latency / args.concurrency:.2f}s, cores={os.cpu_count()}, "
        f"best of {args.repeat}"
    )
    kinds = args.clients.split(",")
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    # interleaved, so background noise lands on every client alike
    for _ in range(args.repeat):
        for kind in kinds:
            runs[kind].append(run_fresh(kind, args.n, args.concurrency, args.latency, args.faults))
    figs: dict[str, dict[str, float]] = {}
    for kind in kinds:
        if args.repeat > 1:
            print(f"{NAMES[kind]:<38} walls: " + " ".join(f"{r['wall_s']:.2f}" for r in runs[kind]))
        figs[kind] = describe(kind, best_of(runs[kind]), args.n, args.concurrency, args.latency)
    if "c" in figs:
        for other in ("a", "b"):
            if other in figs:
                c, o = figs["c"], figs[other]
                print(
                    f"ratio c/{other}: throughput {c['ideal_frac'] / o['ideal_frac']:.3f}  "
                    f"cpu/req {c['cpu_ms'] / o['cpu_ms']:.3f}  peak RSS {c['rss_mb'] / o['rss_mb']:.3f}"
                )


def scale(args: argparse.Namespace) -> None:
    print(f"# scale: c at N=10000 and N=100000, C={args.concurrency} L={args.latency}s")
    small, big = (
        describe(
            "c",
            run_fresh("c", n, args.concurrency, args.latency, False),
            n,
            args.concurrency,
            args.latency,
        )
        for n in (10_000, 100_000)
    )
    print(f"RSS(N=100k)/RSS(N=10k) = {big['rss_mb'] / small['rss_mb']:.3f}  (target <= 1.2)")


def faults(args: argparse.Namespace) -> None:
    print(
        f"# faults: c with and without 10% 429 (Retry-After: 1) + 5% 500, N={args.n} C={args.concurrency} "
        f"L={args.latency}s, best of {args.repeat}"
    )
    results = {}
    for with_faults in (False, True):
        runs = [run_fresh("c", args.n, args.concurrency, args.latency, with_faults) for _ in range(args.repeat)]
        lost = sum(r["lost"] for r in runs)
        best = best_of(runs)
        results[with_faults] = (lost, describe("c", best, args.n, args.concurrency, args.latency))
    clean, faulty = results[False][1], results[True][1]
    print(
        f"throughput(faults)/throughput(clean) = {faulty['ideal_frac'] / clean['ideal_frac']:.3f}  "
        f"(target >= 0.8), lost lines with faults = {results[True][0]} over {args.repeat} run(s) (target 0)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--faults", action="store_true", help="compare mode: the server injects faults")
    parser.add_argument("--clients", default="a,b,c")
    parser.add_argument("--mode", choices=["compare", "scale", "faults", "all"], default="compare")
    parser.add_argument("--repeat", type=int, default=1, help="runs per client; the best wall is reported")
    parser.add_argument("--_client", help=argparse.SUPPRESS)
    parser.add_argument("--_url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._client:
        run_client_here(args._client, args._url, args.n, args.concurrency)
        return
    raise_fd_limit()
    if args.mode in ("compare", "all"):
        compare(args)
    if args.mode in ("scale", "all"):
        scale(args)
    if args.mode in ("faults", "all"):
        faults(args)


if __name__ == "__main__":
    main()
