"""A job's summary as one self-contained HTML page: figures, a latency histogram, throughput over time.

Everything is inline (CSS and SVG, no script, no fonts, no network), so the page opens the same
from a laptop, an attachment or an air-gapped box. Charts are plain SVG with `<title>` tooltips.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sluice.contract import ExecutionStatus, JobStatus

from sluice_local.console import human_usd, write_output
from sluice_local.report_charts import esc, latency_chart, seconds_text, throughput_chart

MAX_SHARD_ROWS = 200
# outcomes a job can end in without having failed as a whole; how many lines failed decides the colour
COMPLETED = frozenset({JobStatus.SUCCEEDED, JobStatus.COMPLETED_WITH_ERRORS})
# at or above this share of lines in errors the badge is red, whatever the job's status says
BAD_ERROR_SHARE = 0.5


def error_share(counts: Mapping[str, Any]) -> float | None:
    requests = int(counts.get("requests") or 0) or int(counts.get("results", 0)) + int(counts.get("errors", 0))
    return int(counts.get("errors", 0)) / requests if requests else None


def badge(status: str, counts: Mapping[str, Any]) -> str:
    """The badge's colour: green only for a job that completed with no line in errors, amber when
    some lines failed, red when the job failed, was cancelled, or at least half its lines failed."""
    if status == JobStatus.BUDGET_EXCEEDED:
        # the job did what its owner asked: stop at the cap; the rest waits for a retry
        return "warn"
    if status not in COMPLETED:
        return (
            "bad"
            if status in (JobStatus.FAILED, JobStatus.CANCELLED, ExecutionStatus.ABORTED, ExecutionStatus.TIMED_OUT)
            else "neutral"
        )
    share = error_share(counts) or 0.0
    if share >= BAD_ERROR_SHARE:
        return "bad"
    return "warn" if share > 0 or status != JobStatus.SUCCEEDED else "good"


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
svg .legend-ok { stroke: var(--bar); stroke-width: 6; } svg .legend-err { stroke: var(--err); stroke-width: 6; }
svg .legend-429 { stroke: var(--warn); stroke-width: 2; }
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
svg .rate { fill: var(--bar); } svg .rate-err { fill: var(--err); }
svg .throttled { fill: none; stroke: var(--warn); stroke-width: 2; }
table.settings td:last-child { text-align: left; }
.error { background: var(--card); border-left: 4px solid var(--err); padding: 8px 12px; border-radius: 4px; }
footer { margin-top: 32px; font-size: 12.5px; }
"""


def _n(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return esc(value)


def _usd(value: float | None) -> str:
    return human_usd(value)


def _tile(key: str, value: str, css: str = "") -> str:
    return f'<div class="tile {css}"><div class="v">{value}</div><div class="k">{esc(key)}</div></div>'


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
        ["turnaround, median", esc(seconds_text(middle) if middle >= 1 else "under 1 s")],
        ["turnaround, longest", esc(seconds_text(turnarounds[-1]) if turnarounds[-1] >= 1 else "under 1 s")],
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
    rows = [["provider, as run", esc(_usd(as_run))]]
    if all_direct is not None:
        rows.append(["the same tokens, all sent directly", esc(_usd(all_direct))])
    if all_batch is not None:
        rows.append(["the same tokens, all through the Batch API", esc(_usd(all_batch))])
    saved = costs.get("batch_savings")
    note = ""
    if saved:
        share = f" ({saved / all_direct:.0%})" if all_direct else ""
        rows.append(["saved by the Batch API", esc(_usd(saved) + share)])
    elif all_batch is not None and all_direct and all_batch < all_direct:
        note = (
            f'<p class="muted">Through the Batch API (--mode batch, results within 24 h) this job would have '
            f"cost {esc(_usd(all_batch))} at the provider instead of {esc(_usd(all_direct))}.</p>"
        )
    if costs.get("aws") is not None:
        rows.append(["AWS (Lambda, Step Functions, DynamoDB, S3)", esc(_usd(costs.get("aws")))])
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


def retry_cause_tiles(causes: Mapping[str, Any] | None) -> list[str]:
    """The attempts sent again besides the 429s, by what they met: a 5xx answer, a lost connection."""
    if not causes:
        return []
    return [
        _tile("retried after a 5xx", _n(causes.get("server_error"))),
        _tile("retried after a lost connection or timeout", _n(causes.get("connection"))),
    ]


def _no_latency(finished: int, hits: int, background: int) -> str:
    if finished and hits == finished:
        return "No latency data: the response cache answered every line, so nothing was sent."
    if background:
        return "No latency data: the lines were background responses, fetched by polls once done."
    return "No latency data: no request got an answer."


def settings_section(summary: Mapping[str, Any]) -> str:
    """How the job was run: its provider (never its key), its settings, its budget and its validation."""
    run = summary.get("run") or {}
    rows: list[list[str]] = []

    def row(name: str, value: Any) -> None:
        if value is not None and value != "":
            rows.append([esc(name), esc(value)])

    row("provider", run.get("provider"))
    row("mode", run.get("mode") or summary.get("mode"))
    row("model", run.get("model") and f"{run['model']} (every line)")
    for key, name in (
        ("concurrency", "requests in flight (concurrency)"),
        ("map_concurrency", "shards at once"),
        ("shard_lines", "lines a shard"),
    ):
        row(name, f"{run[key]:,}" if isinstance(run.get(key), int) else None)
    cap = run.get("max_attempts")
    if isinstance(cap, int):
        # 0: no cap, the last sweep sizes a line's attempts to the faults its shard saw
        row("sends a line at most (last sweep included)", f"{cap:,}" if cap else "as the job needs")
    row("request timeout", run.get("request_timeout_s") and f"{run['request_timeout_s']:g} s")
    rate = summary.get("max_error_rate", run.get("max_error_rate"))
    row("max error rate", None if rate is None else f"{float(rate):g}")
    row("response cache", (summary.get("cache") or {}).get("mode") or run.get("cache"))
    budget = summary.get("budget")
    if budget:
        unsent = int(budget.get("unsent_lines") or 0)
        spent = f"{_usd(budget.get('spent_usd'))} spent of {_usd(budget.get('cap_usd'))}"
        row("budget", spent + (f"; {unsent:,} lines not sent" if unsent else ""))
    elif "budget_usd" in run:
        row("budget", "none" if run["budget_usd"] is None else _usd(run["budget_usd"]))
    row("output validation", validation_text(summary.get("validation")))
    if not rows:
        return ""
    return "<h2>How it ran</h2>" + _table(["", ""], rows, css="settings")


def validation_text(validation: Mapping[str, int] | None) -> str | None:
    """How a validating job's lines ended, and the checks its turned-down answers failed."""
    if not validation:
        return None
    ended = ", ".join(
        f"{int(validation.get(key) or 0):,} {name}"
        for key, name in (("valid_first_time", "valid first time"), ("repaired", "repaired"), ("invalid", "invalid"))
    )
    failed = ", ".join(
        f"{v:,} {k.removeprefix('failed_')}" for k, v in sorted(validation.items()) if k.startswith("failed_")
    )
    return ended + (f"; answers turned down: {failed}" if failed else "")


def _table(headers: list[str], rows: Iterable[list[str]], css: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    table = f'<table class="{css}">' if css else "<table>"
    thead = f"<thead><tr>{head}</tr></thead>" if any(headers) else ""
    return f"{table}{thead}<tbody>{body}</tbody></table>"


def render_report(summary: Mapping[str, Any], *, files: Mapping[str, str] | None = None) -> str:
    """The page for one job. `files` maps output kinds to names next to the page, to link them."""
    job_id = summary.get("job_id", "job")
    status = str(summary.get("status", "UNKNOWN"))
    sections = [
        _heading(summary, files),
        *_tiles(summary),
        settings_section(summary),
        *_latency_sections(summary),
        "<h2>Throughput</h2>",
        throughput_chart(summary.get("timeline") or {}, summary.get("started_at"), failed=status == JobStatus.FAILED),
        cost_section(summary.get("cost_estimate_usd") or {}),
        *_deadline_sections(summary),
        *_error_sections(summary),
        *_shard_sections(summary),
    ]
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    sections.append(
        f'<footer class="muted">Generated by sluice on {generated}. Costs are estimates from list prices; '
        "latencies are bucketed at 5% resolution.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>Sluice report: {esc(job_id)} ({esc(status)})</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )


def _heading(summary: Mapping[str, Any], files: Mapping[str, str] | None) -> str:
    """The job, its status (with the share of its requests in errors), its input, error and files."""
    job_id = summary.get("job_id", "job")
    status = str(summary.get("status", "UNKNOWN"))
    counts = summary.get("counts") or {}
    tone = badge(status, counts)
    share = error_share(counts)
    in_errors = ""
    if share:
        in_errors = (
            f'<span class="share {tone}">{share:.0%} of requests in errors '
            f"({_n(counts.get('errors'))} of {_n(counts.get('requests'))})</span>"
        )
    head = [
        f'<h1>{esc(job_id)} <span class="status {tone}">{esc(status)}</span>{in_errors}</h1>',
        f'<div class="muted">input <code>{esc(summary.get("input", "—"))}</code>'
        + (f" · mode {esc(summary['mode'])}" if summary.get("mode") else "")
        + "</div>",
    ]
    if summary.get("error"):
        head.append(f'<p class="error">{esc(summary["error"])}</p>')
    if files:
        links = " · ".join(f'<a href="{esc(name)}">{esc(kind)}</a>' for kind, name in files.items())
        head.append(f'<p class="muted">files: {links}</p>')
    return "\n".join(head)


def _tiles(summary: Mapping[str, Any]) -> list[str]:
    """The figures at a glance, once the job counted its lines: none before."""
    counts = summary.get("counts") or {}
    if not counts:
        return []
    tokens = summary.get("tokens") or {}
    costs = summary.get("cost_estimate_usd") or {}
    latency = summary.get("latency_s") or {}
    wall = summary.get("wall_seconds")
    turnarounds = batch_turnarounds(summary.get("shards") or [])
    cache = summary.get("cache") or {}
    # lines the provider answered or refused: the cache's hits and invalid lines were never sent
    sent = sum(int(n) for path, n in (summary.get("lines_by_path") or {}).items() if path != "cache")
    rate = sent / wall if wall and sent else None
    timing = [
        _tile("latency p50", esc(seconds_text(latency.get("p50")))),
        _tile("latency p95", esc(seconds_text(latency.get("p95")))),
        _tile("latency p99", esc(seconds_text(latency.get("p99")))),
    ]
    if turnarounds and not summary.get("latency_histogram"):
        longest = turnarounds[-1]
        timing = [
            _tile("batches", _n(len(turnarounds))),
            _tile("batch turnaround, longest", esc(seconds_text(longest) if longest >= 1 else "under 1 s")),
        ]
    tiles = [
        _tile("requests", _n(counts.get("requests"))),
        _tile("results", _n(counts.get("results"))),
        _tile("errors", _n(counts.get("errors")), "err" if counts.get("errors") else ""),
        _tile("job wall time (Plan to Merge)", esc(seconds_text(wall))),
        *(
            [_tile("sluice run in all, with the local cloud", esc(seconds_text(summary["command_seconds"])))]
            if summary.get("command_seconds") is not None
            else []
        ),
        _tile(
            "lines sent a second" if sent else "lines sent a second: none were sent",
            _n(round(rate, 1)) if rate is not None else "—",
        ),
        *timing,
        _tile("tokens in", _n(tokens.get("input"))),
        _tile("tokens out", _n(tokens.get("output"))),
        _tile("retries", _n(summary.get("retries"))),
        *(
            [_tile("attempts of the longest line", _n(summary["max_line_attempts"]))]
            if summary.get("max_line_attempts")
            else []
        ),
        _tile("throttled (429)", _n(summary.get("throttled"))),
        *retry_cause_tiles(summary.get("retries_by_cause")),
        *sweep_tiles(summary.get("sweep")),
        _tile("provider cost (est.)", esc(_usd(costs.get("provider")))),
        _tile("AWS cost (est.)", esc(_usd(costs.get("aws")))),
    ]
    if costs.get("batch_savings"):
        tiles.append(_tile("saved by the Batch API (est.)", esc(_usd(costs.get("batch_savings"))), "ok"))
    if int(cache.get("hits") or 0):
        tiles.append(_tile("answered from the cache", _n(cache.get("hits")), "ok"))
        tiles.append(_tile("sent (cache misses)", _n(cache.get("misses"))))
        tiles.append(_tile("saved by the cache (est.)", esc(_usd(cache.get("saved_usd"))), "ok"))
    return ['<div class="tiles">' + "".join(tiles) + "</div>"]


def _latency_sections(summary: Mapping[str, Any]) -> list[str]:
    """The requests' latency chart, and the batches' turnaround: what each measures, and what not."""
    counts = summary.get("counts") or {}
    finished = int(counts.get("results", 0)) + int(counts.get("errors", 0))
    turnarounds = batch_turnarounds(summary.get("shards") or [])
    histogram = list(summary.get("latency_histogram") or [])
    hits = int((summary.get("cache") or {}).get("hits") or 0)
    sections = ["<h2>Latency</h2>"]
    background = int((summary.get("lines_by_path") or {}).get("background") or 0)
    if histogram or not turnarounds:
        if turnarounds:
            sections.append(
                '<p class="muted">Requests sent directly; batch rows are in the batch turnaround below.</p>'
            )
        if background:
            sections.append(
                f'<p class="muted">Requests answered on their own round trip; the {background:,} background '
                "responses are not in it: a poll fetched each once it was done, so their time is the provider's "
                "queue and the polling, not a request's latency.</p>"
            )
        latency = summary.get("latency_s") or {}
        sections.append(latency_chart(histogram, latency, empty=_no_latency(finished, hits, background)))
    if turnarounds:
        sections.append(batch_section(turnarounds, direct=bool(histogram)))
    return sections


def _error_sections(summary: Mapping[str, Any]) -> list[str]:
    """Each error code, how many lines it ended, and one message for it."""
    errors = summary.get("errors_by_code") or {}
    if not errors:
        return []
    examples = summary.get("error_examples") or {}
    rows = (
        [f"<code>{esc(c)}</code>", _n(n), f'<span class="example">{esc(examples.get(c, "—"))}</span>']
        for c, n in sorted(errors.items(), key=lambda item: -int(item[1]))
    )
    return ["<h2>Errors by code</h2>", _table(["code", "lines", "for example"], rows, css="examples")]


def _deadline_sections(summary: Mapping[str, Any]) -> list[str]:
    """A deadline job's plan next to how it ran, and each shard's choice, why and cost."""
    deadline = summary.get("deadline")
    if not deadline:
        return []
    held = "met" if deadline.get("met") else "MISSED"
    lines = [
        "<h2>Deadline</h2>",
        f"<p>deadline {esc(deadline.get('deadline'))}: {held}, ended {esc(deadline.get('ended_at'))} "
        f"(expected {esc(deadline.get('expected_finish'))}); batches not ended by "
        f"{esc(deadline.get('cutover_at') or '—')} cancelled and the rest sent direct. Batch turnaround planned "
        f"on: {esc(seconds_text(deadline.get('batch_turnaround_s')))} "
        f"({esc(deadline.get('batch_turnaround_source'))}).</p>",
        f"<p>provider cost as run {_usd(deadline.get('as_run_usd'))} (planned {_usd(deadline.get('planned_usd'))}) "
        f"against {_usd(deadline.get('all_direct_usd'))} all direct and {_usd(deadline.get('all_batch_usd'))} "
        "all batch.</p>",
    ]
    if deadline.get("flex_fallback_lines"):
        lines.append(
            f"<p>{_n(deadline['flex_fallback_lines'])} lines of the flex shards went on at the standard tier, "
            "at list price: flex had no capacity for them, or the model refused it.</p>"
        )
    shards = [s for s in summary.get("shards") or [] if s.get("choice")][:MAX_SHARD_ROWS]
    rows = (
        [
            _n(s.get("shard")),
            esc(s["choice"]),
            esc(", ".join(f"{path} {n:,}" for path, n in (s.get("paths") or {}).items())),
            _usd((s.get("provider_cost_usd") or {}).get("as_run")),
            _usd((s.get("provider_cost_usd") or {}).get("all_direct")),
            _usd((s.get("provider_cost_usd") or {}).get("all_batch")),
            f'<span class="example">{esc(s.get("why", ""))}</span>',
        ]
        for s in shards
    )
    lines.append(_table(["shard", "choice", "ran", "cost", "all direct", "all batch", "why"], rows, css="examples"))
    return lines


def _shard_sections(summary: Mapping[str, Any]) -> list[str]:
    """A row per shard, the first MAX_SHARD_ROWS of them."""
    shards = list(summary.get("shards") or [])
    if not shards:
        return []
    sections = [f"<h2>Shards ({len(shards):,})</h2>"]
    swept = any(s.get("swept") for s in shards)
    rows = (
        [
            _n(s.get("shard")),
            esc(s.get("mode", "")),
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
    return sections


def write_report(summary: Mapping[str, Any], path: Path, *, files: Mapping[str, str] | None = None) -> Path:
    return write_output(path, render_report(summary, files=files).encode())
