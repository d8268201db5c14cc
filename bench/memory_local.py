"""Peak memory and speed of `sluice run` on the local cloud as the input grows.

For each size it writes a file of distinct review requests (examples/make_reviews.py), runs
`sluice run` on it against the built-in simulator in a process of its own, and prints the peak
resident memory of that process (VmHWM from /proc, read as it exits) and its lines a second. Memory
that does not grow with the input keeps the peak flat across sizes; time linear in lines keeps
lines a second flat.

    python bench/memory_local.py                      # 10^4 and 10^5 lines
    python bench/memory_local.py --lines 1000000      # a million lines: minutes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from make_reviews import build  # noqa: E402

# run in the child: the CLI, then its peak RSS to the file named by argv[1], whatever the exit
CHILD = """
import atexit, sys
from pathlib import Path

def peak() -> None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            Path(sys.argv[1]).write_text(line.split()[1])

atexit.register(peak)
from sluice_local.cli import main
code = main(sys.argv[2:])
peak()
sys.exit(code)
"""
LIMIT_MB = 1024


def write_input(path: Path, lines: int) -> None:
    with path.open("w") as out:
        for start in range(0, lines, 10_000):
            chunk = build(min(10_000, lines - start), seed=start // 10_000 + 11)
            for n, row in enumerate(chunk, start):
                out.write(json.dumps({**row, "custom_id": f"r-{n}"}, separators=(",", ":")) + "\n")


def _hwm_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def run(lines: int, work: Path, extra: list[str], timeout_s: float) -> dict[str, float] | None:
    source = work / f"in-{lines}.jsonl"
    write_input(source, lines)
    peak_file = work / f"peak-{lines}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}"}
    env = {k: v for k, v in env.items() if not k.startswith(("AWS_", "OPENAI_", "ANTHROPIC_"))}
    argv = ["run", str(source), "--out", str(work / f"out-{lines}"), "--quiet", "--latency", "0", *extra]
    started = time.monotonic()
    errors = work / f"stderr-{lines}"
    with errors.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(peak_file), *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        seen = 0
        # the peak so far, read from outside too: a run stopped by --timeout still shows its peak
        while child.poll() is None and time.monotonic() - started < timeout_s:
            seen = max(seen, _hwm_kb(child.pid))
            time.sleep(1.0)
        if child.poll() is None:
            child.terminate()
            child.wait()
            print(f"{lines:,} lines: stopped after {timeout_s:.0f} s, peak RSS so far {seen / 1024:.0f} MB")
            return None
    seconds = time.monotonic() - started
    if child.returncode != 0:
        raise SystemExit(f"sluice run on {lines:,} lines exited {child.returncode}:\n{errors.read_text()[-3000:]}")
    peak_mb = max(seen, int(peak_file.read_text())) / 1024
    return {
        "lines": lines,
        "input_mb": source.stat().st_size / 1e6,
        "peak_rss_mb": peak_mb,
        "seconds": seconds,
        "lines_per_s": lines / seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, nargs="+", default=[10_000, 100_000], help="input sizes, in lines")
    parser.add_argument("--cache", action="store_true", help="keep the response cache on (the runs use --no-cache)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON lines")
    parser.add_argument("--timeout", type=float, default=7200.0, help="stop a run after this many seconds")
    args = parser.parse_args()
    extra = [] if args.cache else ["--no-cache"]
    print(f"{'lines':>10} {'input MB':>9} {'peak RSS MB':>12} {'seconds':>9} {'lines/s':>9}")
    over = False
    with tempfile.TemporaryDirectory(prefix="sluice-memory-") as tmp:
        for lines in args.lines:
            row = run(lines, Path(tmp), extra, args.timeout)
            if row is None:
                continue
            over |= row["peak_rss_mb"] > LIMIT_MB
            if args.json:
                print(json.dumps(row))
            else:
                print(
                    f"{lines:>10,} {row['input_mb']:>9.1f} {row['peak_rss_mb']:>12.0f} "
                    f"{row['seconds']:>9.1f} {row['lines_per_s']:>9.0f}"
                )
    if over:
        print(f"peak RSS above {LIMIT_MB} MB")
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
