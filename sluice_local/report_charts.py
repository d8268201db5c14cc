"""The report's charts: plain SVG, no script, with `<title>` tooltips.

The latency histogram has a bar per log-spaced bucket; throughput is bucketed into at most
`MAX_BARS` bars of a round width whatever the job's length, its time axis in one unit, with
the 429s the lines met drawn over it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from typing import Any

from sluice.shard.stats import latency_bucket_bounds_s

WIDTH = 720
HEIGHT = 220
PAD_LEFT = 56
PAD_RIGHT = 16
PAD_TOP = 14
PAD_BOTTOM = 38
# a throughput chart has at most this many bars, of the first of BAR_WIDTHS_S that fits
MAX_BARS = 60
BAR_WIDTHS_S = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
# the time axis's unit, by the span it covers: seconds up to 5 minutes, minutes up to 5 hours
TIME_UNITS = ((300.0, 1.0, "s"), (18000.0, 60.0, "min"), (math.inf, 3600.0, "h"))


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def seconds_text(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _nice_max(value: float) -> float:
    """The axis top: 1, 2 or 5 times a power of ten, at or above `value`."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= value))


def _frame(y_max: float, y_label: str) -> list[str]:
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    bottom = HEIGHT - PAD_BOTTOM
    parts = [
        f'<line class="axis" x1="{PAD_LEFT}" y1="{bottom}" x2="{WIDTH - PAD_RIGHT}" y2="{bottom}"/>',
        f'<line class="axis" x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" y2="{HEIGHT - PAD_BOTTOM}"/>',
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = HEIGHT - PAD_BOTTOM - fraction * plot_h
        label = y_max * fraction
        text = f"{label:,.0f}" if label >= 10 or label == int(label) else f"{label:.2g}"
        parts.append(
            f'<line class="axis" x1="{PAD_LEFT - 4}" y1="{y:.1f}" x2="{WIDTH - PAD_RIGHT}" y2="{y:.1f}" opacity="0.5"/>'
        )
        parts.append(f'<text x="{PAD_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(text)}</text>')
    parts.append(
        f'<text x="12" y="{PAD_TOP + plot_h / 2:.1f}" transform="rotate(-90 12 {PAD_TOP + plot_h / 2:.1f})" '
        f'text-anchor="middle">{esc(y_label)}</text>'
    )
    return parts


def _anchor(x: float) -> str:
    """Labels near either edge grow inwards, so none is cut off."""
    if x > WIDTH - PAD_RIGHT - 30:
        return "end"
    if x < PAD_LEFT + 30:
        return "start"
    return "middle"


def _x_label(x: float, text: str) -> str:
    return f'<text x="{x:.1f}" y="{HEIGHT - PAD_BOTTOM + 14}" text-anchor="{_anchor(x)}">{esc(text)}</text>'


def _ticks(slots: int, most: int = 6) -> list[int]:
    """Up to `most` evenly spread positions out of 0..slots, both ends included."""
    if slots <= most:
        return list(range(slots + 1))
    return sorted({round(i * slots / (most - 1)) for i in range(most)})


def _svg(label: str, parts: Iterable[str]) -> str:
    body = "\n".join(parts)
    return f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc(label)}" xmlns="http://www.w3.org/2000/svg">\n{body}\n</svg>'


# the chart's labels are set at 11 px (`report.py`'s `svg text`); a character of them is at most this wide,
# with a gap to the next label
LABEL_CHAR_PX = 7.0
LABEL_GAP_PX = 4.0


def label_width(text: str) -> float:
    """How wide a percentile's label may be drawn, its gap to the next included."""
    return LABEL_CHAR_PX * len(text) + LABEL_GAP_PX


def latency_chart(
    histogram: list[Mapping[str, Any]],
    percentiles: Mapping[str, float | None],
    empty: str = "No latency data: no request got an answer.",
) -> str:
    """One bar per non-empty bucket, on a log-time axis (the buckets are log-spaced, so equal widths);
    `empty` says why there are none."""
    if not histogram:
        return f'<p class="muted">{esc(empty)}</p>'
    first = min(int(b["bucket"]) for b in histogram)
    last = max(int(b["bucket"]) for b in histogram)
    slots = last - first + 1
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    slot_w = plot_w / slots
    y_max = _nice_max(max(int(b["count"]) for b in histogram))
    parts = _frame(y_max, "requests")
    for b in sorted(histogram, key=lambda b: int(b["bucket"])):
        count = int(b["count"])
        h = plot_h * count / y_max
        x = PAD_LEFT + (int(b["bucket"]) - first) * slot_w
        tip = f"{seconds_text(float(b['from_s']))} to {seconds_text(float(b['to_s']))}: {count:,} requests"
        parts.append(
            f'<rect class="bar" x="{x + 0.5:.1f}" y="{HEIGHT - PAD_BOTTOM - h:.1f}" width="{max(slot_w - 1, 1):.1f}" '
            f'height="{h:.1f}"><title>{esc(tip)}</title></rect>'
        )

    def x_of(seconds: float) -> float | None:
        # a percentile is reported as its bucket's upper bound (rounded): the nearest bound on the
        # log axis names the bucket, and the marker sits at that bucket's right edge
        if seconds <= 0:
            return None
        index = min(
            range(first, last + 1), key=lambda k: abs(math.log(latency_bucket_bounds_s(k)[1]) - math.log(seconds))
        )
        return PAD_LEFT + (index - first + 1) * slot_w

    for offset in _ticks(slots):
        # a bucket boundary: the lower bound of bucket `first + offset`
        parts.append(_x_label(PAD_LEFT + offset * slot_w, seconds_text(latency_bucket_bounds_s(first + offset)[0])))
    lines: set[float] = set()
    # each row's labels as (from, to) x spans: a label takes the first row where it overlaps none,
    # so percentiles in one bucket, or in buckets narrower than a label, stack instead of overprinting
    rows: list[list[tuple[float, float]]] = []
    for name, value in percentiles.items():
        if value is None:
            continue
        px = x_of(float(value))
        if px is None:
            continue
        if px not in lines:
            lines.add(px)
            parts.append(f'<line class="pct" x1="{px:.1f}" y1="{PAD_TOP}" x2="{px:.1f}" y2="{HEIGHT - PAD_BOTTOM}"/>')
        end = px > WIDTH - PAD_RIGHT - 30
        x = px - 3 if end else px + 3
        width = label_width(name)
        span = (x - width, x) if end else (x, x + width)
        row = next((r for r, taken in enumerate(rows) if all(span[1] < a or span[0] > b for a, b in taken)), len(rows))
        if row == len(rows):
            rows.append([])
        rows[row].append(span)
        parts.append(
            f'<text class="pct-label" x="{x:.1f}" y="{PAD_TOP + 10 + 12 * row}" '
            f'text-anchor="{"end" if end else "start"}">{esc(name)}</text>'
        )
    parts.append(
        f'<text x="{PAD_LEFT + plot_w / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle">latency (log scale)</text>'
    )
    return _svg("latency histogram", parts)


def _legend(entries: list[tuple[str, str]]) -> list[str]:
    """A key in the top right corner of the plot: a short stroke in each series' style, and its name."""
    width = 40 + 6 * max(len(label) for _, label in entries)
    x = WIDTH - PAD_RIGHT - width
    parts = [
        f'<rect x="{x - 6}" y="{PAD_TOP + 2}" width="{width + 4}" height="{8 + 14 * len(entries)}" '
        'fill="var(--card)" opacity="0.85" class="legend"/>'
    ]
    for row, (css, label) in enumerate(entries):
        y = PAD_TOP + 12 + 14 * row
        parts.append(f'<line class="{css}" x1="{x}" y1="{y - 4}" x2="{x + 22}" y2="{y - 4}"/>')
        parts.append(f'<text class="legend-label" x="{x + 28}" y="{y}">{esc(label)}</text>')
    return parts


def timeline_points(timeline: Mapping[str, Any]) -> list[tuple[float, int, int, int]]:
    """(start in epoch seconds, results, errors, 429s) for every step from the first completion
    to the last, zeros included: an idle step is part of the story."""
    # whole milliseconds, so float steps like 0.1 s walk the range without drifting
    step = max(round(float(timeline.get("step_s") or 1) * 1000), 1)
    counts: dict[int, tuple[int, int, int]] = {}
    for point in timeline.get("points") or []:
        # a summary of an earlier release has no 429s in its points
        t, ok, err, throttled = (*point, 0)[:4]
        counts[round(float(t) * 1000)] = (int(ok), int(err), int(throttled))
    if not counts:
        return []
    start, end = min(counts), max(counts)
    return [(t / 1000, *counts.get(t, (0, 0, 0))) for t in range(start, end + 1, step)]


def bar_width_s(step_s: float, span_s: float) -> float:
    """The first round width, no finer than the timeline's steps, that draws `span_s` in at most MAX_BARS bars."""
    for width in BAR_WIDTHS_S:
        if width >= step_s - 1e-9 and span_s / width <= MAX_BARS:
            return float(width)
    return float(BAR_WIDTHS_S[-1])


def bars(points: list[tuple[float, int, int, int]], origin: float, width_s: float) -> list[tuple[int, int, int]]:
    """(results, errors, 429s) per bar of `width_s`, the first starting at `origin` (the job's start)."""

    def index(t: float) -> int:
        # steps of 0.1 s are not exact in binary: 0.5 // 0.1 is 4.0
        return max(math.floor((t - origin) / width_s + 1e-6), 0)

    binned = [[0, 0, 0] for _ in range(index(points[-1][0]) + 1 if points else 1)]
    for t, ok, err, throttled in points:
        slot = binned[index(t)]
        slot[0] += ok
        slot[1] += err
        slot[2] += throttled
    return [(ok, err, throttled) for ok, err, throttled in binned]


def _time_axis(span_s: float) -> tuple[float, str, float]:
    """(seconds a unit, the unit's name, seconds between ticks) for a time axis `span_s` long."""
    per_unit, unit = next((size, name) for limit, size, name in TIME_UNITS if span_s <= limit)
    span = span_s / per_unit
    tick = next(
        (m * 10**e for e in range(-1, 6) for m in (1, 2, 5) if span / (m * 10**e) <= 6),
        span,
    )
    return per_unit, unit, tick * per_unit


def _number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:g}"


def throughput_chart(timeline: Mapping[str, Any], started_at: float | None, *, failed: bool = False) -> str:
    """Lines ended a second over the job's wall time, in bars of one round width (results, with
    errors on top), and the 429s those lines met as a line over them. A `failed` job's summary may
    lack the figures of what was sent: it then says nothing of what was."""
    points = timeline_points(timeline)
    if not points and failed:
        return (
            '<p class="muted">No throughput data: the job failed before its shards\' figures were gathered. '
            "Requests may have been sent and paid for; the errors say what became of each line.</p>"
        )
    if not points:
        return '<p class="muted">No throughput data: nothing was sent to the provider.</p>'
    step = float(timeline.get("step_s") or 1)
    origin = started_at if started_at is not None and started_at <= points[0][0] else points[0][0]
    width_s = bar_width_s(step, points[-1][0] + step - origin)
    binned = bars(points, origin, width_s)
    span_s = len(binned) * width_s
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    bottom = HEIGHT - PAD_BOTTOM
    y_max = _nice_max(max(max(ok + err, throttled) / width_s for ok, err, throttled in binned))
    parts = _frame(y_max, "per second")
    bar_w = plot_w / len(binned)

    def y_of(count: int) -> float:
        return plot_h * count / width_s / y_max

    per_unit, unit, tick_s = _time_axis(span_s)
    for i, (ok, err, throttled) in enumerate(binned):
        x = PAD_LEFT + i * bar_w
        start, end = i * width_s / per_unit, (i + 1) * width_s / per_unit
        tip = (
            f"{_number(start)} to {_number(end)} {unit}: {(ok + err) / width_s:,.1f} lines/s "
            f"({ok:,} results, {err:,} errors, {throttled:,} 429s in {_number(width_s)} s)"
        )
        ok_h, err_h = y_of(ok), y_of(err)
        parts.append(
            f'<rect class="rate" x="{x + 0.5:.1f}" y="{bottom - ok_h:.1f}" width="{max(bar_w - 1, 1):.1f}" '
            f'height="{ok_h:.1f}"><title>{esc(tip)}</title></rect>'
        )
        if err:
            parts.append(
                f'<rect class="rate-err" x="{x + 0.5:.1f}" y="{bottom - ok_h - err_h:.1f}" '
                f'width="{max(bar_w - 1, 1):.1f}" height="{err_h:.1f}"><title>{esc(tip)}</title></rect>'
            )
    legend = [("legend-ok", "results"), ("legend-err", "errors")] if any(e for _, e, _ in binned) else []
    legend = legend or [("legend-ok", "results")]
    if any(throttled for _, _, throttled in binned):
        line = " ".join(
            f"{PAD_LEFT + (i + 0.5) * bar_w:.1f},{bottom - y_of(t):.1f}" for i, (_, _, t) in enumerate(binned)
        )
        parts.append(f'<polyline class="throttled" points="{line}"/>')
        legend.append(("legend-429", "429s (throttled)"))
    parts.extend(_legend(legend))
    ticks = int(span_s // tick_s + 1e-9)
    for n in range(ticks + 1):
        parts.append(_x_label(PAD_LEFT + plot_w * n * tick_s / span_s, _number(n * tick_s / per_unit)))
    parts.append(
        f'<text x="{PAD_LEFT + plot_w / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle">'
        f"{esc(f'{unit} since the job started (bars of {_number(width_s)} s)')}</text>"
    )
    return _svg("throughput over time", parts)
