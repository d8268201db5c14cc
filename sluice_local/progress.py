"""`sluice run`'s live progress: counts from the shards as they happen, drawn on one line.

The shards run in this process, so the local cloud hands them a `LiveCounts` (a
`sluice.shard.progress.ProgressSink`) and every line reports here the moment its fate is known:
no AWS request, no wait for a checkpoint. The shard rows' counters, written with each
checkpoint and summed on read, are what `sluice status --watch` shows for a deployed job; here
only the total comes from the job row, once Plan has written it.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from sluice.contract import DEFAULT_PROVIDER
from sluice.contract.model import Outcome
from sluice.core.costs import provider_cost_usd
from sluice.providers import RequestFormat, family, token_counts
from sluice.send.output_check import INVALID, REPAIRED

from sluice_local.console import human_usd

# the rate (and so the ETA) is over the last few seconds, so a slow start or a stall shows
RATE_WINDOW_S = 10.0
# an ETA needs this many lines answered within the window: one slow first answer is no rate
MIN_ETA_LINES = 10
# the display redraws at least this often, whether or not a line finished
REFRESH_S = 0.5
BAR_CELLS = 20
PLANNING = "planning: reading and checking the input"


@dataclass(frozen=True)
class Snapshot:
    """The job as far as this process has seen it."""

    total: int | None
    results: int
    errors: int
    # lines the provider holds to answer later: background responses and batch rows
    waiting: int
    tokens_in: int
    tokens_out: int
    cost_usd: float | None
    throttled: int
    elapsed_s: float
    # results answered from the response cache (in `results` too)
    cached: int = 0
    # a validating job's lines an answer sent again made valid, and those still invalid at the end
    repaired: int = 0
    invalid_output: int = 0

    @property
    def done(self) -> int:
        # a line re-sent after a Lambda was cut short reports twice; the job never has more lines than its total
        finished = self.results + self.errors
        return min(finished, self.total) if self.total is not None else finished

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out


# the lines' counts as the shards report them, named as the `Snapshot` names them
_COUNTED = ("results", "errors", "waiting", "throttled", "cached", "repaired", "invalid_output")


class LiveCounts:
    """A thread-safe `ProgressSink`: shards on several threads report, the display reads."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, request_format: RequestFormat | None = None
    ) -> None:
        self._clock = clock
        # how the answers read: a local run's provider (the simulator, or OPENAI_BASE_URL) speaks the default family
        self._format = request_format or family(DEFAULT_PROVIDER)
        self._started = clock()
        self._lock = threading.Lock()
        self.total: int | None = None
        self._counts = dict.fromkeys(_COUNTED, 0)
        # (model, answered by the Batch API) -> [tokens in, out, cached in, cache write], priced as
        # the summary prices them
        self._tokens: dict[tuple[str, bool], list[int]] = {}

    def outcome(self, outcome: Outcome, *, batch: bool, waited: bool) -> None:
        used = self._format.usage(outcome.body) if outcome.ok else None
        tokens = token_counts(used)
        model = self._format.answered_model(outcome.body)
        with self._lock:
            counts = self._counts
            counts["throttled"] += outcome.throttled
            counts["waiting"] -= waited
            counts["repaired"] += outcome.validation == REPAIRED
            counts["invalid_output"] += outcome.validation == INVALID
            if not outcome.ok:
                counts["errors"] += 1
                return
            counts["results"] += 1
            if tokens[0] or tokens[1]:
                # an answer served at flex is billed at the Batch API's prices, as the summary prices it
                discounted = batch or self._format.batch_priced(outcome.body)
                per_model = self._tokens.setdefault((model or "", discounted), [0, 0, 0, 0])
                for i, count in enumerate(tokens):
                    per_model[i] += count

    def invalid(self, code: str) -> None:
        with self._lock:
            self._counts["errors"] += 1

    def waiting(self, count: int) -> None:
        with self._lock:
            self._counts["waiting"] += count

    def cached(self, count: int) -> None:
        with self._lock:
            self._counts["results"] += count
            self._counts["cached"] += count

    def snapshot(self) -> Snapshot:
        with self._lock:
            tokens = {key: list(value) for key, value in self._tokens.items()}
            counts = dict(self._counts)
        direct = provider_cost_usd({m: t for (m, b), t in tokens.items() if not b})
        batched = provider_cost_usd({m: t for (m, b), t in tokens.items() if b}, batch=True)
        counts["waiting"] = max(counts["waiting"], 0)
        return Snapshot(
            total=self.total,
            tokens_in=sum(t[0] for t in tokens.values()),
            tokens_out=sum(t[1] for t in tokens.values()),
            cost_usd=None if direct is None and batched is None else (direct or 0.0) + (batched or 0.0),
            elapsed_s=self._clock() - self._started,
            **counts,
        )


class RateMeter:
    """Lines a second over the last `window_s` seconds, and what that makes the time left."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self._window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, at: float, done: int) -> None:
        self._samples.append((at, done))
        while len(self._samples) > 2 and at - self._samples[1][0] >= self._window_s:
            self._samples.popleft()

    def rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def eta_s(self, remaining: int) -> float | None:
        if remaining <= 0:
            return 0.0
        if len(self._samples) < 2 or self._samples[-1][1] - self._samples[0][1] < MIN_ETA_LINES:
            return None
        rate = self.rate()
        return remaining / rate if rate else None


def compact(n: float) -> str:
    """12, 1.2k, 12.3k, 1.2M: a count that fits a status line."""
    if n < 1000:
        return f"{n:,.0f}"
    for divisor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= divisor:
            value = n / divisor
            return f"{value:.1f}{suffix}" if value < 100 else f"{value:.0f}{suffix}"
    return f"{n:,.0f}"


def clock(seconds: float | None) -> str:
    """0:07, 1:02:03: elapsed and remaining time as a status line shows them."""
    if seconds is None:
        return "?"
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_line(
    snapshot: Snapshot, *, rate: float | None, eta_s: float | None, width: int, phase: str = "planning"
) -> str:
    """One status line no wider than `width`: what matters most is kept when the terminal is narrow.
    Until the job knows its total, the line says what it is doing (`phase`)."""
    s = snapshot
    if s.total is None:
        return f"{clock(s.elapsed_s)} {phase}…"[:width]
    fields = [
        f"{rate:,.0f} req/s" if rate is not None else "— req/s",
        f"ETA {clock(eta_s)}" if s.done < s.total else "all done, writing the outputs",
        f"{s.errors:,} errors" if s.errors else "",
        f"{s.cached:,} cached" if s.cached else "",
        f"{s.repaired:,} repaired" if s.repaired else "",
        f"{s.invalid_output:,} invalid" if s.invalid_output else "",
        f"{s.waiting:,} at the provider" if s.waiting else "",
        f"{compact(s.tokens)} tokens",
        f"{human_usd(s.cost_usd)} (est.)" if s.cost_usd is not None else "",
        f"429s: {s.throttled:,}" if s.throttled else "",
    ]
    # rounded down: 100% only once every line is done
    percent = f"{100 * s.done // s.total:3d}%" if s.total else ""
    head = f"{clock(s.elapsed_s)} {s.done:,}/{s.total:,} {percent}".rstrip()
    tail = " · ".join(f for f in fields if f)
    # a bar of fixed width (so it does not twitch as the figures change), dropped first when room is short
    if s.total and width - len(head) - len(tail) - 5 >= BAR_CELLS:
        cells = BAR_CELLS
        filled = cells * s.done / s.total
        bar = "█" * int(filled) + ("▌" if filled - int(filled) >= 0.5 else "")
        return f"{head} |{bar:<{cells}}| {tail}"
    line = f"{head} · {tail}"
    while len(line) > width and " · " in line:
        line = line.rsplit(" · ", 1)[0]
    return line[:width]


class Display:
    """Redraws one status line on a terminal, from a background thread, at least every `REFRESH_S`.

    Off a terminal (a pipe, a log file, CI) or with `quiet`, it draws nothing: the last line
    `sluice run` prints says how the job went.
    """

    def __init__(
        self,
        counts: LiveCounts,
        *,
        stream: TextIO | None = None,
        quiet: bool = False,
        refresh_s: float = REFRESH_S,
        width: Callable[[], int] | None = None,
    ) -> None:
        self._counts = counts
        self._stream = stream or sys.stderr
        self.enabled = not quiet and _is_terminal(self._stream)
        self._refresh_s = refresh_s
        self._width = width or self._terminal_width
        self._meter = RateMeter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._screen = threading.Lock()
        self._drawn = False
        # what the line says before Plan has counted the lines
        self.phase = PLANNING

    def _terminal_width(self) -> int:
        try:
            return os.get_terminal_size(self._stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            return shutil.get_terminal_size((100, 24)).columns

    def render(self) -> str:
        snapshot = self._counts.snapshot()
        if snapshot.total is not None:
            # the rate counts from the plan, not from the start of the local cloud, and only lines
            # the provider answered: the cache's hits arrive all at once and say nothing of the rest
            self._meter.add(snapshot.elapsed_s, snapshot.done - snapshot.cached)
        remaining = snapshot.total - snapshot.done if snapshot.total is not None else 0
        # the last column stays empty: some terminals wrap a line that fills the width
        width = max(self._width() - 1, 20)
        return format_line(
            snapshot, rate=self._meter.rate(), eta_s=self._meter.eta_s(remaining), width=width, phase=self.phase
        )

    def draw(self) -> None:
        line = self.render()
        with self._screen:
            if not self._stop.is_set():
                self._stream.write("\r" + line + "\x1b[K")
                self._stream.flush()
                self._drawn = True

    def note(self, text: str) -> None:
        """A line of its own above the status line, which the next redraw puts back."""
        with self._screen:
            if self._drawn:
                self._stream.write("\r\x1b[K")
                self._drawn = False
            self._stream.write(text + "\n")
            self._stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self._refresh_s):
            self.draw()

    def start(self) -> None:
        if self.enabled and self._thread is None:
            self.draw()
            self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop redrawing and take the line off the screen, so what follows starts on a clean line."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._screen:
            if self._drawn:
                self._stream.write("\r\x1b[K")
                self._stream.flush()
                self._drawn = False

    @contextmanager
    def starting(self, phase: str) -> Iterator[Display]:
        """Show `phase` with a running clock until the job starts (or this block ends)."""
        self.phase = phase
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def __enter__(self) -> Display:
        self.phase = PLANNING
        if self._thread is None:
            self.start()
        elif self.enabled:
            # the new phase is shown at once: a plan quicker than a redraw would otherwise never show
            self.draw()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
