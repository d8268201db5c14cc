"""The first seconds against providers that send no rate headers, each figure with its bound.

Each figure starts a small server on 127.0.0.1 (no x-ratelimit-* header on any answer) and runs a
job through the local cloud (moto, in-process Lambdas) with `sluice run`'s defaults (concurrency
1,000, shards of 5,000 lines, shared limit on), unless told otherwise:

  refuse     every request answered 404 (a wrong base URL), through `sluice run` itself (with
             OPENAI_BASE_URL at the server, --no-cache): --lines lines must end within 15 s, the
             local cloud's start included, with exit 8 and the provider's message.
  timeouts   every answer takes --slow-s, over a 1 s request timeout, 2 attempts (as
             `--latency 3 --request-timeout 1 --max-attempts 2`): --timeout-lines lines.
  vllm       a vLLM-like server: 200 after --latency s, no rate headers; the requests in flight
             each quarter second of the first seconds, against --vllm-concurrency (200: at 1,000,
             opening the connections alone takes this machine about a second).

    .venv/bin/python bench/failfast.py
    .venv/bin/python bench/failfast.py --only vllm --vllm-concurrency 500 --latency 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

import orjson  # noqa: E402
from aiohttp import web  # noqa: E402

from sluice_local.cloud import LocalCloud, LocalSettings, run_job  # noqa: E402

WORK = ROOT / ".work"
FIGURES = ("refuse", "timeouts", "vllm")
SAMPLE_S = 0.25


@dataclass
class Server:
    """Answers every request with `status` after `latency_s`, without rate headers; counts what is
    in flight, sampled every SAMPLE_S from the first request on."""

    status: int
    latency_s: float
    in_flight: int = 0
    requests: int = 0
    first_at: float | None = None
    samples: list[int] = field(default_factory=list)
    base_url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _sampler: asyncio.Task[None] | None = None
    _runner: web.AppRunner | None = None
    _thread: threading.Thread | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.requests += 1
        self.in_flight += 1
        if self.first_at is None:
            self.first_at = time.monotonic()
            self._sampler = asyncio.get_running_loop().create_task(self._sample())
        try:
            await asyncio.sleep(self.latency_s)
        finally:
            self.in_flight -= 1
        if self.status != 200:
            # what a web server says under a path it does not serve: its own page, not JSON
            return web.Response(status=self.status, text=f"{self.status}: Not Found")
        body = {
            "id": f"chatcmpl-{self.requests}",
            "object": "chat.completion",
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _sample(self) -> None:
        while len(self.samples) < 4 / SAMPLE_S:
            self.samples.append(self.in_flight)
            await asyncio.sleep(SAMPLE_S)

    def __enter__(self) -> Server:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.handle)
            self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="failfast-server", daemon=True)
        self._thread.start()
        ready.wait(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._thread is not None:
            if self._sampler is not None:
                self._loop.call_soon_threadsafe(self._sampler.cancel)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)


def make_input(path: Path, lines: int) -> None:
    with path.open("wb") as out:
        for n in range(lines):
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"Say hi to {n}"}]}
            row = {"custom_id": f"q-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            out.write(orjson.dumps(row) + b"\n")


def run(server: Server, lines: int, settings: LocalSettings) -> tuple[float, dict[str, Any], Counter[str]]:
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"failfast-{lines}.jsonl"
    make_input(path, lines)
    cloud = LocalCloud(provider_base_url=server.base_url, api_key="sk-bench-failfast", settings=settings)
    with cloud.running():
        started = time.monotonic()
        job = run_job(cloud, path)
        wall = time.monotonic() - started
    path.unlink()
    codes = Counter(str(e["error"]["code"]) for e in job.errors)
    return wall, job.summary, codes


def refuse(args: argparse.Namespace) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"failfast-refuse-{args.lines}.jsonl"
    out = WORK / "failfast-refuse"
    make_input(path, args.lines)
    with Server(status=404, latency_s=0.0) as server:
        env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-bench-failfast"}
        command = [str(Path(sys.executable).parent / "sluice"), "run", str(path), "--out", str(out), "--no-cache"]
        command += ["--concurrency", str(args.concurrency), "--quiet"]
        started = time.monotonic()
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
    path.unlink()
    summary = orjson.loads((out / f"{path.stem}.summary.json").read_bytes())
    shutil.rmtree(out)
    verdict = "within" if wall <= 15 and done.returncode == 8 else "NOT within"
    print(
        f"refuse    {args.lines:,} lines, every answer 404 without rate headers: `sluice run` exits {done.returncode} "
        f"after {wall:.1f} s ({verdict} 15 s with exit 8; the job itself {summary['wall_seconds']:.1f} s), "
        f"{server.requests:,} requests sent",
        flush=True,
    )
    for line in (done.stdout + done.stderr).splitlines():
        print(f"          | {line}", flush=True)


def timeouts(args: argparse.Namespace) -> None:
    with Server(status=200, latency_s=args.slow_s) as server:
        settings = LocalSettings(concurrency=args.concurrency, cache="off", request_timeout_s=1.0, max_attempts=2)
        wall, summary, codes = run(server, args.timeout_lines, settings)
    print(
        f"timeouts  {args.timeout_lines:,} lines, answers in {args.slow_s:g} s, 1 s timeout, 2 attempts: {wall:.1f} s, "
        f"{server.requests:,} attempts; {summary.get('status')}, errors by code {dict(codes)}",
        flush=True,
    )


def vllm(args: argparse.Namespace) -> None:
    with Server(status=200, latency_s=args.latency) as server:
        settings = LocalSettings(concurrency=args.vllm_concurrency, cache="off")
        wall, summary, _ = run(server, args.vllm_lines, settings)
    results = summary.get("counts", {}).get("results", 0)
    print(
        f"vllm      {args.vllm_lines:,} lines, 200 after {args.latency:g} s without rate headers, concurrency "
        f"{args.vllm_concurrency:,}: {wall:.1f} s, {results:,} results",
        flush=True,
    )
    print(
        "          in flight every {:g} s from the first request: {}".format(
            SAMPLE_S, " ".join(str(n) for n in server.samples)
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=FIGURES, help="run one of the figures")
    parser.add_argument("--lines", type=int, default=2000, help="lines of the refuse figure")
    parser.add_argument("--timeout-lines", type=int, default=20, help="lines of the timeouts figure")
    parser.add_argument("--slow-s", type=float, default=3.0, help="seconds per answer in the timeouts figure")
    parser.add_argument("--vllm-lines", type=int, default=1000, help="lines of the vllm figure")
    parser.add_argument("--concurrency", type=int, default=1000, help="requests in flight per job (refuse, timeouts)")
    parser.add_argument("--vllm-concurrency", type=int, default=200, help="requests in flight in the vllm figure")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per answer in the vllm figure")
    args = parser.parse_args()
    for figure in [args.only] if args.only else FIGURES:
        {"refuse": refuse, "timeouts": timeouts, "vllm": vllm}[figure](args)


if __name__ == "__main__":
    main()
