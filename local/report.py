"""A job's summary as one self-contained HTML page: figures, a latency histogram, throughput over time.

Everything is inline (CSS and SVG, no script, no fonts, no network), so the page opens the same
from a laptop, an attachment or an air-gapped box. Charts are plain SVG with `<title>` tooltips.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sluice.stats import latency_bucket_bounds_s

WIDTH = 720
HEIGHT = 220
PAD_LEFT = 56
PAD_RIGHT = 16
PAD_TOP = 14
PAD_BOTTOM = 38
MAX_SHARD_ROWS = 200
# outcomes a job can end in without having failed as a whole; how many lines failed decides the colour
COMPLETED = frozenset({"SUCCEEDED", "COMPLETED_WITH_ERRORS"})
# at or above this share of lines in errors the badge is red, whatever the job's status says
BAD_ERROR_SHARE = 0.5


def error_share(counts: Mapping[str, Any]) -> float | None:
    requests = int(counts.get("requests") or 0) or int(counts.get("results", 0)) + int(counts.get("errors", 0))
    return int(counts.get("errors", 0)) / requests if requests else None


def badge(status: str, counts: Mapping[str, Any]) -> str:
    """The badge's colour: green only for a job that completed with no line in errors, amber when
    some lines failed, red when the job failed, was cancelled, or at least half its lines failed."""
    if status == "BUDGET_EXCEEDED":
        # the job did what its owner asked: stop at the cap; the rest waits for a retry
        return "warn"
    if status not in COMPLETED:
        return "bad" if status in ("FAILED", "CANCELLED", "ABORTED", "TIMED_OUT") else "neutral"
    share = error_share(counts) or 0.0
    if share >= BAD_ERROR_SHARE:
        return "bad"
    return "warn" if share > 0 or status != "SUCCEEDED" else "good"


STYLE = """
:root { --fg:#1d2330; --muted:#5f6b7a; --bg:#ffffff; --card:#f4f6f9; --line:#d8dde5;
        --ok:#2f7d4f; --warn:#a86207; --err:#b3382c; --bar:#3c6fb6; --accent:#7a4fb3; }
@media (prefers-color-scheme: dark) {
  :root { --fg:#e6e9ef; --muted:#9aa5b4; --bg:#14171c; --card:#1e232b; --line:#343b46;
          --ok:#5cc28a; --warn:#e0a84a; --err:#f07a6e; --bar:#6f9ee6; --accent:#b28cf0; }
}
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 980px; padding: 24px; color: var(--fg); background: var(--bg);
       font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.muted { color: var(--muted); } code { font: 13px ui-monospace, SFMono-Regular, Menlo, monospace; }
.status { display: inline-block; padding: 1px 10px; border-radius: 10px; font-weight: 600; font-size: 13px;
          color: #fff; background: var(--muted); vertical-align: 3px; }
.status.good { background: var(--ok); } .status.warn { background: var(--warn); }
.status.bad { background: var(--err); }
.share { font-size: 14px; font-weight: 400; margin-left: 8px; } .share.warn { color: var(--warn); }
.share.bad { color: var(--err); }
.example { display: block; text-align: left; color: var(--muted); font-size: 13px; overflow-wrap: anywhere; }
.tile.ok .v { color: var(--ok); }
table.examples th:last-child { text-align: left; width: 65%; }
svg .legend-ok { stroke: var(--ok); stroke-width: 2; } svg .legend-err { stroke: var(--err); stroke-width: 1.5; }
.tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 10px; margin-top: 16px; }
.tile { background: var(--card); border-radius: 8px; padding: 10px 12px; }
.tile .v { font-size: 21px; font-weight: 650; } .tile .k { color: var(--muted); font-size: 12.5px; }
.tile.err .v { color: var(--err); }
table { border-collapse: collapse; width: 100%; font-size: 14px; }
th, td { text-align: right; padding: 4px 8px; border-bottom: 1px solid var(--line); }
th:first-child, td:first-child { text-align: left; }
svg { width: 100%; height: auto; background: var(--card); border-radius: 8px; }
svg text { fill: var(--muted); font: 11px system-ui, sans-serif; }
svg .axis { stroke: var(--line); } svg .bar { fill: var(--bar); }
svg .pct { stroke: var(--accent); stroke-dasharray: 4 3; } svg .pct-label { fill: var(--accent); }
svg .line { fill: none; stroke: var(--ok); stroke-width: 2; } svg .point { fill: var(--ok); }
svg .errors { fill: none; stroke: var(--err); stroke-width: 1.5; } svg .error-point { fill: var(--err); }
.error { background: var(--card); border-left: 4px solid var(--err); padding: 8px 12px; border-radius: 4px; }
footer { margin-top: 32px; font-size: 12.5px; }
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _n(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return _e(value)


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _usd(value: float | None) -> str:
    if value is None:
        return "—"
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def _tile(key: str, value: str, css: str = "") -> str:
    return f'<div class="tile {css}"><div class="v">{value}</div><div class="k">{_e(key)}</div></div>'


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
        parts.append(f'<text x="{PAD_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_e(text)}</text>')
    parts.append(
        f'<text x="12" y="{PAD_TOP + plot_h / 2:.1f}" transform="rotate(-90 12 {PAD_TOP + plot_h / 2:.1f})" '
        f'text-anchor="middle">{_e(y_label)}</text>'
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
    return f'<text x="{x:.1f}" y="{HEIGHT - PAD_BOTTOM + 14}" text-anchor="{_anchor(x)}">{_e(text)}</text>'


def _ticks(slots: int, most: int = 6) -> list[int]:
    """Up to `most` evenly spread positions out of 0..slots, both ends included."""
    if slots <= most:
        return list(range(slots + 1))
    return sorted({round(i * slots / (most - 1)) for i in range(most)})


def _svg(label: str, parts: Iterable[str]) -> str:
    body = "\n".join(parts)
    return f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_e(label)}" xmlns="http://www.w3.org/2000/svg">\n{body}\n</svg>'


def latency_chart(histogram: list[Mapping[str, Any]], percentiles: Mapping[str, float | None]) -> str:
    """One bar per non-empty bucket, on a log-time axis (the buckets are log-spaced, so equal widths)."""
    if not histogram:
        return '<p class="muted">No latency data: no request got an answer.</p>'
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
        tip = f"{_seconds(float(b['from_s']))} to {_seconds(float(b['to_s']))}: {count:,} requests"
        parts.append(
            f'<rect class="bar" x="{x + 0.5:.1f}" y="{HEIGHT - PAD_BOTTOM - h:.1f}" width="{max(slot_w - 1, 1):.1f}" '
            f'height="{h:.1f}"><title>{_e(tip)}</title></rect>'
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
        parts.append(_x_label(PAD_LEFT + offset * slot_w, _seconds(latency_bucket_bounds_s(first + offset)[0])))
    marked: dict[float, int] = {}
    for name, value in percentiles.items():
        if value is None:
            continue
        px = x_of(float(value))
        if px is None:
            continue
        # percentiles in the same bucket share a line; their names stack
        row = marked.get(px, 0)
        marked[px] = row + 1
        if row == 0:
            parts.append(f'<line class="pct" x1="{px:.1f}" y1="{PAD_TOP}" x2="{px:.1f}" y2="{HEIGHT - PAD_BOTTOM}"/>')
        end = px > WIDTH - PAD_RIGHT - 30
        parts.append(
            f'<text class="pct-label" x="{px - 3 if end else px + 3:.1f}" y="{PAD_TOP + 10 + 12 * row}" '
            f'text-anchor="{"end" if end else "start"}">{_e(name)}</text>'
        )
    parts.append(
        f'<text x="{PAD_LEFT + plot_w / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle">latency (log scale)</text>'
    )
    return _svg("latency histogram", parts)


def timeline_points(timeline: Mapping[str, Any]) -> list[tuple[float, int, int]]:
    """(start in epoch seconds, results, errors) for every step from the first completion to the
    last, zeros included: an idle step is part of the story."""
    # whole milliseconds, so float steps like 0.1 s walk the range without drifting
    step = max(round(float(timeline.get("step_s") or 1) * 1000), 1)
    counts = {round(float(t) * 1000): (int(ok), int(err)) for t, ok, err in timeline.get("points") or []}
    if not counts:
        return []
    start, end = min(counts), max(counts)
    return [(t / 1000, *counts.get(t, (0, 0))) for t in range(start, end + 1, step)]


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
        parts.append(f'<text class="legend-label" x="{x + 28}" y="{y}">{_e(label)}</text>')
    return parts


def throughput_chart(timeline: Mapping[str, Any], started_at: float | None) -> str:
    """Completed requests per second over the job's wall time: one point per timeline step."""
    points = timeline_points(timeline)
    if not points:
        return '<p class="muted">No throughput data: nothing was sent to the provider.</p>'
    step = float(timeline.get("step_s") or 1)
    origin = started_at if started_at is not None else points[0][0]
    plot_w = WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    y_max = _nice_max(max((ok + err) / step for _, ok, err in points))
    parts = _frame(y_max, "requests / s")
    span = max(len(points) - 1, 1)

    def xy(i: int, value: float) -> tuple[float, float]:
        x = PAD_LEFT + (plot_w * i / span if len(points) > 1 else plot_w / 2)
        return x, HEIGHT - PAD_BOTTOM - plot_h * value / y_max

    total = [xy(i, (ok + err) / step) for i, (_, ok, err) in enumerate(points)]
    parts.append('<polyline class="line" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in total) + '"/>')
    for (x, y), (t, ok, err) in zip(total, points, strict=True):
        at = _seconds(max(t - origin, 0))
        tip = f"+{at}: {(ok + err) / step:,.1f} req/s ({ok:,} results, {err:,} errors in {step:g} s)"
        parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="2.5"><title>{_e(tip)}</title></circle>')
    legend = [("legend-ok", "completed (results + errors)")]
    if any(err for _, _, err in points):
        errors = [xy(i, err / step) for i, (_, _, err) in enumerate(points)]
        parts.append('<polyline class="errors" points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in errors) + '"/>')
        legend.append(("legend-err", "errors"))
    parts.extend(_legend(legend))
    for i in _ticks(len(points) - 1) if len(points) > 1 else [0]:
        parts.append(_x_label(xy(i, 0)[0], f"+{_seconds(max(points[i][0] - origin, 0))}"))
    parts.append(
        f'<text x="{PAD_LEFT + plot_w / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle">'
        f"time since the job started ({step:g} s steps)</text>"
    )
    return _svg("throughput over time", parts)


def batch_turnarounds(shards: Iterable[Mapping[str, Any]]) -> list[float]:
    """Seconds from each batch's creation to its end, as the provider reported them."""
    found: list[float] = []
    for shard in shards:
        for batch in (shard.get("batch") or {}).get("batches") or []:
            if batch.get("turnaround_s") is not None:
                found.append(float(batch["turnaround_s"]))
    return sorted(found)


def batch_section(turnarounds: list[float], *, direct: bool) -> str:
    """Why a batch has no per-request latency, and what it has instead."""
    n = len(turnarounds)
    middle = turnarounds[(n - 1) // 2]
    intro = (
        ""
        if direct
        else "<p>No per-request latency: the Batch API answers a batch's rows together, "
        "so the time that matters is each batch's turnaround.</p>"
    )
    whole = (
        '<p class="muted">The provider reports batch times in whole seconds: a batch that took under a second '
        "shows 0 s.</p>"
        if turnarounds[-1] < 1
        else ""
    )
    rows = [
        ["batches", _n(n)],
        ["turnaround, median", _e(_seconds(middle) if middle >= 1 else "under 1 s")],
        ["turnaround, longest", _e(_seconds(turnarounds[-1]) if turnarounds[-1] >= 1 else "under 1 s")],
    ]
    return intro + "<h3>Batch turnaround (created to ended)</h3>" + _table(["", ""], rows) + whole


def cost_section(costs: Mapping[str, Any]) -> str:
    """What the provider work cost as run, next to all-direct and all-batch, and what batching saved."""
    as_run, all_direct, all_batch = (
        costs.get("provider"),
        costs.get("provider_all_direct"),
        costs.get("provider_all_batch"),
    )
    if as_run is None:
        return ""
    rows = [["provider, as run", _e(_usd(as_run))]]
    if all_direct is not None:
        rows.append(["the same tokens, all sent directly", _e(_usd(all_direct))])
    if all_batch is not None:
        rows.append(["the same tokens, all through the Batch API", _e(_usd(all_batch))])
    saved = costs.get("batch_savings")
    note = ""
    if saved:
        share = f" ({saved / all_direct:.0%})" if all_direct else ""
        rows.append(["saved by the Batch API", _e(_usd(saved) + share)])
    elif all_batch is not None and all_direct and all_batch < all_direct:
        note = (
            f'<p class="muted">Through the Batch API (--mode batch, results within 24 h) this job would have '
            f"cost {_e(_usd(all_batch))} at the provider instead of {_e(_usd(all_direct))}.</p>"
        )
    if costs.get("aws") is not None:
        rows.append(["AWS (Lambda, Step Functions, DynamoDB, S3)", _e(_usd(costs.get("aws")))])
    return "<h2>Cost (estimate, list prices)</h2>" + _table(["", "USD"], rows) + note


def sweep_tiles(sweep: Mapping[str, Any] | None) -> list[str]:
    """The last sweep's figures: lines whose attempts ran out on transient failures and were sent
    once more at their shard's end, and how many of those ended as results."""
    if sweep is None:
        return []
    swept = int(sweep.get("swept") or 0)
    if not swept:
        return [_tile("lines swept (last pass)", "0")]
    recovered = int(sweep.get("recovered") or 0)
    return [
        _tile("lines swept (last pass)", _n(swept)),
        _tile("recovered by the sweep", _n(recovered), "ok" if recovered == swept else ""),
    ]


def _table(headers: list[str], rows: Iterable[list[str]], css: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    table = f'<table class="{css}">' if css else "<table>"
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    return f"{table}{thead}<tbody>{body}</tbody></table>"


def render_report(summary: Mapping[str, Any], *, files: Mapping[str, str] | None = None) -> str:
    """The page for one job. `files` maps output kinds to names next to the page, to link them."""
    job_id = summary.get("job_id", "job")
    status = str(summary.get("status", "UNKNOWN"))
    counts = summary.get("counts") or {}
    tokens = summary.get("tokens") or {}
    costs = summary.get("cost_estimate_usd") or {}
    latency = summary.get("latency_s") or {}
    wall = summary.get("wall_seconds")
    finished = int(counts.get("results", 0)) + int(counts.get("errors", 0))
    sections: list[str] = []

    tone = badge(status, counts)
    share = error_share(counts)
    in_errors = ""
    if share:
        in_errors = (
            f'<span class="share {tone}">{share:.0%} of requests in errors '
            f"({_n(counts.get('errors'))} of {_n(counts.get('requests'))})</span>"
        )
    head = [
        f'<h1>{_e(job_id)} <span class="status {tone}">{_e(status)}</span>{in_errors}</h1>',
        f'<div class="muted">input <code>{_e(summary.get("input", "—"))}</code>'
        + (f" · mode {_e(summary['mode'])}" if summary.get("mode") else "")
        + "</div>",
    ]
    if summary.get("error"):
        head.append(f'<p class="error">{_e(summary["error"])}</p>')
    if files:
        links = " · ".join(f'<a href="{_e(name)}">{_e(kind)}</a>' for kind, name in files.items())
        head.append(f'<p class="muted">files: {links}</p>')
    sections.append("\n".join(head))

    turnarounds = batch_turnarounds(summary.get("shards") or [])
    histogram = list(summary.get("latency_histogram") or [])
    if counts:
        rate = finished / wall if wall else None
        timing = [
            _tile("latency p50", _e(_seconds(latency.get("p50")))),
            _tile("latency p95", _e(_seconds(latency.get("p95")))),
            _tile("latency p99", _e(_seconds(latency.get("p99")))),
        ]
        if turnarounds and not histogram:
            longest = turnarounds[-1]
            timing = [
                _tile("batches", _n(len(turnarounds))),
                _tile("batch turnaround, longest", _e(_seconds(longest) if longest >= 1 else "under 1 s")),
            ]
        tiles = [
            _tile("requests", _n(counts.get("requests"))),
            _tile("results", _n(counts.get("results"))),
            _tile("errors", _n(counts.get("errors")), "err" if counts.get("errors") else ""),
            _tile("wall time", _e(_seconds(wall))),
            _tile("throughput (req/s)", _n(round(rate, 1)) if rate is not None else "—"),
            *timing,
            _tile("tokens in", _n(tokens.get("input"))),
            _tile("tokens out", _n(tokens.get("output"))),
            _tile("retries", _n(summary.get("retries"))),
            _tile("throttled (429)", _n(summary.get("throttled"))),
            *sweep_tiles(summary.get("sweep")),
            _tile("provider cost (est.)", _e(_usd(costs.get("provider")))),
            _tile("AWS cost (est.)", _e(_usd(costs.get("aws")))),
        ]
        if costs.get("batch_savings"):
            tiles.append(_tile("saved by the Batch API (est.)", _e(_usd(costs.get("batch_savings"))), "ok"))
        cache = summary.get("cache") or {}
        if cache.get("hits"):
            tiles.append(_tile("answered from the cache", _n(cache.get("hits")), "ok"))
            tiles.append(_tile("sent (cache misses)", _n(cache.get("misses"))))
            tiles.append(_tile("saved by the cache (est.)", _e(_usd(cache.get("saved_usd"))), "ok"))
        sections.append('<div class="tiles">' + "".join(tiles) + "</div>")

    sections.append("<h2>Latency</h2>")
    if histogram or not turnarounds:
        if turnarounds:
            sections.append(
                '<p class="muted">Requests sent directly; batch rows are in the batch turnaround below.</p>'
            )
        sections.append(latency_chart(histogram, latency))
    if turnarounds:
        sections.append(batch_section(turnarounds, direct=bool(histogram)))
    sections.append("<h2>Throughput</h2>")
    sections.append(throughput_chart(summary.get("timeline") or {}, summary.get("started_at")))

    sections.append(cost_section(costs))

    errors = summary.get("errors_by_code") or {}
    if errors:
        examples = summary.get("error_examples") or {}
        sections.append("<h2>Errors by code</h2>")
        rows = (
            [f"<code>{_e(c)}</code>", _n(n), f'<span class="example">{_e(examples.get(c, "—"))}</span>']
            for c, n in sorted(errors.items(), key=lambda item: -int(item[1]))
        )
        sections.append(_table(["code", "lines", "for example"], rows, css="examples"))

    shards = list(summary.get("shards") or [])
    if shards:
        sections.append(f"<h2>Shards ({len(shards):,})</h2>")
        swept = any(s.get("swept") for s in shards)
        rows = (
            [
                _n(s.get("shard")),
                _e(s.get("mode", "")),
                _n(s.get("first_line")),
                _n(s.get("lines")),
                _n(s.get("results")),
                _n(s.get("errors")),
                *([_n(s.get("swept", 0)), _n(s.get("recovered", 0))] if swept else []),
            ]
            for s in shards[:MAX_SHARD_ROWS]
        )
        headers = ["shard", "mode", "first line", "lines", "results", "errors"]
        sections.append(_table(headers + (["swept", "recovered"] if swept else []), rows))
        if len(shards) > MAX_SHARD_ROWS:
            sections.append(
                f'<p class="muted">… and {len(shards) - MAX_SHARD_ROWS:,} more shards (see the summary JSON)</p>'
            )

    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    sections.append(
        f'<footer class="muted">Generated by sluice on {generated}. Costs are estimates from list prices; '
        "latencies are bucketed at 5% resolution.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>Sluice report: {_e(job_id)} ({_e(status)})</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )


def write_report(summary: Mapping[str, Any], path: Path, *, files: Mapping[str, str] | None = None) -> Path:
    path.write_text(render_report(summary, files=files), encoding="utf-8")
    return path
