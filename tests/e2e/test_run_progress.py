"""`sluice run` at a terminal: the progress line moves at least once a second, then the last line sums up."""

from __future__ import annotations

import fcntl
import itertools
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
FRAME = re.compile(rb"^\d+:\d\d ")
COUNT = re.compile(rb"(\d[\d,]*)/300 ")


def test_progress_at_a_terminal_moves_every_second_and_the_last_line_adds_tokens_and_cost(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "steady.jsonl", [request_line(f"l-{n}") for n in range(300)])
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'functions'}:{ROOT}", "TERM": "xterm"}
    env.pop("OPENAI_BASE_URL", None)
    env.pop("OPENAI_API_KEY", None)
    command = [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--out", str(tmp_path / "out")]
    command += ["--latency", "0.1", "--concurrency", "10"]
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    arrivals: list[tuple[float, bytes]] = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.1)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        arrivals.append((time.monotonic(), chunk))
    proc.wait(timeout=30)
    os.close(leader)
    screen = b"".join(chunk for _, chunk in arrivals)
    assert proc.returncode == 0, screen.decode(errors="replace")[-2000:]

    drawn = [(at, frame) for at, chunk in arrivals for frame in chunk.split(b"\r") if FRAME.match(frame)]
    # the clock runs from the moment the local cloud starts...
    assert b"starting the local cloud" in drawn[0][1]
    assert any(b"planning" in frame for _, frame in drawn)
    # ...and from the plan to the end of the job the line is redrawn at least once a second. (Before
    # that, moto's state machine parser leaves enough objects for a full garbage collection to
    # pause the interpreter for over a second on a loaded machine: those frames are not timed.)
    frames = [(at, frame) for at, frame in drawn if COUNT.search(frame)]
    assert frames, screen.decode(errors="replace")[-2000:]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(frames)]
    assert max(gaps, default=0) <= 1.0, [(round(g, 2), frames[i][1][:60]) for i, g in enumerate(gaps) if g > 1]
    done = {int(COUNT.search(frame).group(1).replace(b",", b"")) for _, frame in frames}  # type: ignore[union-attr]
    # the count climbs through the job, not 0 -> 300
    assert len({n for n in done if 0 < n < 300}) >= 3, sorted(done)
    assert all(b"req/s" in frame for _, frame in frames)
    assert any(b"ETA" in frame and b"tokens" in frame and b"(est.)" in frame for _, frame in frames)
    last = next(line for line in screen.splitlines() if b"SUCCEEDED" in line)
    assert re.search(rb"300 results, 0 errors, [\d,]+ tokens \([\d,]+ in, [\d,]+ out\), \$0\.\d+ at list prices", last)
