"""`sluice run` N times in a row against a provider that answers every request the same bad way.

For each status (404 a web server's page, 401 and 403 OpenAI's JSON error for a wrong key, 500 with
an empty body) a stock web server on 127.0.0.1 (`http.server`'s, as `python -m http.server` runs it:
its listen queue of 5 is what made the old runs wait) answers every request so, GET /models too, and
`sluice run FILE --no-cache --quiet` runs against it as a subprocess, --runs times in a row, each
with its own --out. Each run must exit with its documented code within --limit-s (the local cloud's
start included), print no traceback, and account for every line of the input (results + errors = the input's requests).

    .venv/bin/python bench/badprovider.py                       # 20 runs of each status, examples/reviews.jsonl
    .venv/bin/python bench/badprovider.py --runs 3 --only 500

It prints one row a status: runs, exit codes seen, max seconds, tracebacks, lines accounted, and the
server's requests (the most any run sent).
"""

from __future__ import annotations

import argparse
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import orjson  # noqa: E402

WORK = ROOT / ".work"
STATUSES = (404, 401, 403, 500)
# what `sluice run` exits with for each (docs/cli.md: "How a job ends", sluice_local/console.py)
EXPECTED = {404: 8, 401: 8, 403: 8, 500: 8}


BAD_KEY = {
    "error": {
        "message": "Incorrect API key provided: sk-bench***. You can find your API key at https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


class Handler(http.server.BaseHTTPRequestHandler):
    """What a stock web server does: `python -m http.server`'s ThreadingHTTPServer, HTTP/1.0 (a
    connection a request) and a listen queue of 5, so 1,000 connections at once overflow it."""

    status = 404
    counter: list[int] = [0]

    def answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.counter[0] += 1
        if self.status == 404:
            # a web server's own page, not JSON
            self.send_error(404)
            return
        body = orjson.dumps(BAD_KEY) if self.status in (401, 403) else b""
        self.send_response(self.status)
        if body:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, format: str, *args: object) -> None:
        pass


class Quiet(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        # a client that gave up its request (as a refused run does) closes the socket: a broken pipe here
        pass


@dataclass
class Server:
    status: int
    base_url: str = ""
    _server: http.server.ThreadingHTTPServer | None = None
    _counter: list[int] = field(default_factory=lambda: [0])

    @property
    def requests(self) -> int:
        return self._counter[0]

    def __enter__(self) -> Server:
        handler = type("Bad", (Handler,), {"status": self.status, "counter": self._counter})
        self._server = Quiet(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, name="bad-provider", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def requests_in(path: Path) -> int:
    return sum(1 for raw in path.read_bytes().splitlines() if raw.strip())


@dataclass
class Run:
    code: int | None
    seconds: float
    traceback: bool
    accounted: bool
    requests: int
    said: str
    # refused before the job started: nothing sent, no outputs
    none_sent: bool = False


def one_run(server: Server, path: Path, out: Path, limit_s: float, extra: list[str]) -> Run:
    env = {**os.environ, "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-bench-badprovider"}
    # this checkout's code: the virtualenv's `sluice` script runs whichever checkout it was installed from
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "functions"), str(ROOT)])
    command = [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--out", str(out), "--no-cache"]
    command += ["--quiet", *extra]
    before = server.requests
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, env=env, cwd=ROOT, capture_output=True, text=True, check=False, timeout=limit_s * 6
        )
        code: int | None = done.returncode
        text = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        text = (exc.stdout or b"").decode() + (exc.stderr or b"").decode() if isinstance(exc.stdout, bytes) else ""
    seconds = time.monotonic() - started
    accounted = none_sent = False
    summary_path = out / f"{path.stem}.summary.json"
    if summary_path.exists():
        counts = orjson.loads(summary_path.read_bytes()).get("counts", {})
        results = _lines(out / f"{path.stem}.results.jsonl")
        errors = _lines(out / f"{path.stem}.errors.jsonl")
        total = requests_in(path)
        accounted = results + errors == total and counts.get("results", -1) + counts.get("errors", -1) == total
    elif "nothing was sent" in text and server.requests - before == 1:
        # refused at the check of GET /models, before the job: no line was sent, none has an output
        accounted, none_sent = True, True
    shutil.rmtree(out, ignore_errors=True)
    return Run(code, seconds, "Traceback" in text, accounted, server.requests - before, text.strip(), none_sent)


def _lines(path: Path) -> int:
    return requests_in(path) if path.exists() else -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", default=str(ROOT / "examples" / "reviews.jsonl"), help="the input (the demo's)")
    parser.add_argument("--runs", type=int, default=20, help="runs in a row for each status")
    parser.add_argument("--only", type=int, choices=STATUSES, help="one status")
    parser.add_argument("--limit-s", type=float, default=20.0, help="the most seconds a run may take")
    parser.add_argument("--show", action="store_true", help="print what each run said")
    parser.add_argument("extra", nargs="*", help="more `sluice run` options, after --")
    args = parser.parse_args()
    path = Path(args.file)
    WORK.mkdir(parents=True, exist_ok=True)
    rows = []
    failed = False
    for status in [args.only] if args.only else STATUSES:
        runs: list[Run] = []
        with Server(status) as server:
            for n in range(args.runs):
                run = one_run(server, path, WORK / f"badprovider-{status}-{n}", args.limit_s, args.extra)
                runs.append(run)
                if args.show:
                    print(f"  {status} run {n + 1}: exit {run.code} in {run.seconds:.1f} s, {run.requests} requests")
                    for line in run.said.splitlines():
                        print(f"    | {line}")
        codes = Counter(str(r.code) for r in runs)
        ok = all(
            r.code == EXPECTED[status] and r.seconds <= args.limit_s and not r.traceback and r.accounted for r in runs
        )
        failed = failed or not ok
        rows.append(
            (
                str(status),
                str(len(runs)),
                ", ".join(f"{n} x {c}" for c, n in sorted(codes.items())),
                f"{max(r.seconds for r in runs):.1f}",
                str(sum(r.traceback for r in runs)),
                f"{sum(r.accounted for r in runs)}/{len(runs)}"
                + (" (nothing sent: refused at GET /models)" if all(r.none_sent for r in runs) else ""),
                str(max(r.requests for r in runs)),
                "ok" if ok else "NOT ok",
            )
        )
        print(f"{status}: {rows[-1][2]}; last said: {runs[-1].said.splitlines()[:3]}", flush=True)
    head = ("status", "runs", "exit codes", "max s", "tracebacks", "lines accounted", "max requests", "verdict")
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head))]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
