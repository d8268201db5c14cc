"""The HTML report: one bar per latency bucket, one point per timeline step, and nothing external."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from sluice.contract.model import Outcome
from sluice.providers import OPENAI
from sluice.shard.stats import TIMELINE_MAX_POINTS, Stats

from sluice_local.report import render_report
from sluice_local.report_charts import timeline_points
from sluice_local.run_end import error_lines, longest


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def of(self, tag: str, css: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag and css in (a.get("class") or "").split()]


def parse(page: str) -> Tags:
    tags = Tags()
    tags.feed(page)
    return tags


def outcome(line: int, latency_s: float, ok: bool = True) -> Outcome:
    body = {"model": "gpt-4o-mini", "usage": {"prompt_tokens": 10, "completion_tokens": 2}}
    return Outcome(
        line=line,
        custom_id=f"c-{line}",
        status_code=200 if ok else 500,
        body=body if ok else None,
        request_id=None,
        error_code=None if ok else "retries_exhausted",
        latency_s=latency_s,
    )


def summary_of(stats: Stats, **extra: Any) -> dict[str, Any]:
    """The parts of merge_job's summary the report reads, from a Stats the way merge builds them."""
    return {
        "job_id": "reviews-0123456789ab",
        "status": "SUCCEEDED",
        "input": "s3://bucket/inbox/reviews.jsonl",
        "counts": {"lines": 10, "blank": 0, "requests": 10, "results": stats.results, "errors": stats.error_count},
        "errors_by_code": stats.errors,
        "tokens": {"input": stats.tokens_in, "output": stats.tokens_out},
        "latency_s": {q: stats.percentile_s(v) for q, v in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
        "latency_histogram": stats.latency_histogram(),
        "timeline": stats.timeline_dict(),
        "started_at": 1000.0,
        "wall_seconds": 2.0,
        "cost_estimate_usd": {"provider": 0.0012, "aws": 0.0003},
        "shards": [
            {
                "shard": 0,
                "mode": "direct",
                "first_line": 1,
                "lines": 10,
                "results": stats.results,
                "errors": stats.error_count,
            }
        ],
        **extra,
    }


def test_one_bar_per_latency_bucket_tallest_where_most_requests_are() -> None:
    stats = Stats()
    latencies = [0.012] * 3 + [0.1] * 5 + [1.0] * 2
    for n, latency in enumerate(latencies):
        stats.add_outcome(outcome(n, latency), at=1000.0, request_format=OPENAI)
    page = parse(render_report(summary_of(stats)))

    bars = page.of("rect", "bar")
    assert len(bars) == len(stats.latency_histogram()) == 3
    heights = [float(b["height"] or 0) for b in bars]
    assert heights.index(max(heights)) == 1  # the 100 ms bucket holds 5 of 10
    # p50 in the 100 ms bucket; p95 and p99 both in the 1 s one share its line, their names stacked
    assert len(page.of("text", "pct-label")) == 3 and len(page.of("line", "pct")) == 2
    # log-spaced buckets keep their places: empty buckets between them are gaps, not squeezed out
    xs = [float(b["x"] or 0) for b in bars]
    index = [int(b["bucket"]) for b in stats.latency_histogram()]
    assert (xs[2] - xs[1]) / (xs[1] - xs[0]) == pytest.approx((index[2] - index[1]) / (index[1] - index[0]), rel=0.01)


def test_one_bar_per_step_of_a_short_job_including_idle_ones() -> None:
    stats = Stats()
    for n, at in enumerate([1000.05, 1000.15, 1000.16, 1000.55]):
        stats.add_outcome(outcome(n, 0.1), at=at, request_format=OPENAI)
    stats.add_outcome(outcome(9, 0.1, ok=False), at=1000.31, request_format=OPENAI)
    summary = summary_of(stats)
    assert summary["timeline"]["step_s"] == 0.1

    points = timeline_points(summary["timeline"])
    assert [round(t, 1) for t, _, _, _ in points] == [1000.0, 1000.1, 1000.2, 1000.3, 1000.4, 1000.5]
    assert [(ok, err) for _, ok, err, _ in points] == [(1, 0), (2, 0), (0, 0), (0, 1), (0, 0), (1, 0)]
    page = parse(render_report(summary))
    bars = page.of("rect", "rate")
    assert len(bars) == 6 and len(page.of("rect", "rate-err")) == 1
    # the peak step (2 results in 0.1 s = 20 a second) is the tallest bar
    heights = [float(b["height"] or 0) for b in bars]
    assert heights.index(max(heights)) == 1


def _axis(page: str) -> tuple[list[str], str]:
    """The throughput chart's time ticks and its axis title."""
    chart = page[page.index('aria-label="throughput over time"') :]
    labels = re.findall(r'<text x="[\d.]+" y="196" text-anchor="\w+">([^<]*)</text>', chart)
    title = re.findall(r'y="214" text-anchor="middle">([^<]*)</text>', chart)[0]
    return labels, title


def test_a_job_of_a_few_minutes_gets_round_bars_and_ticks_in_one_unit() -> None:
    stats = Stats()
    for n in range(1560):
        stats.add_outcome(outcome(n, 0.5, ok=n % 50 != 0), at=1000 + n / 10, request_format=OPENAI)  # 2.6 minutes
    throttled = outcome(9999, 0.5)
    throttled.throttled = 40
    stats.add_outcome(throttled, at=1100.0, request_format=OPENAI)
    assert stats.timeline_step_ms <= 1000
    page = render_report(summary_of(stats))
    tags = parse(page)

    assert len(tags.of("rect", "rate")) == 32  # bars of 5 s, not a dot per step
    labels, title = _axis(page)
    assert title == "s since the job started (bars of 5 s)"
    assert labels == ["0", "50", "100", "150"]
    assert len(tags.of("polyline", "throttled")) == 1


def test_a_long_job_coarsens_its_timeline_and_its_chart_stays_readable() -> None:
    stats = Stats()
    for n in range(2000):
        stats.add_outcome(outcome(n, 0.5), at=10_000 + n, request_format=OPENAI)  # one a second for 2000 s
    assert len(stats.timeline) <= TIMELINE_MAX_POINTS
    assert stats.timeline_step_ms == 5_000
    assert sum(slot[0] for slot in stats.timeline.values()) == 2000
    page = render_report(summary_of(stats, started_at=10_000.0))
    assert len(parse(page).of("rect", "rate")) == 34
    labels, title = _axis(page)
    assert title == "min since the job started (bars of 60 s)"
    assert labels == ["0", "10", "20", "30"]


def test_merging_shards_with_different_steps_keeps_every_completion() -> None:
    fine, coarse = Stats(), Stats()
    for n in range(10):
        fine.add_outcome(outcome(n, 0.2), at=500.0 + n / 10, request_format=OPENAI)
    for n in range(3000):
        coarse.add_outcome(outcome(n, 0.2), at=500.0 + n, request_format=OPENAI)
    merged = Stats.from_dict(fine.to_dict())
    merged.merge(Stats.from_dict(coarse.to_dict()))
    assert merged.timeline_step_ms == coarse.timeline_step_ms > fine.timeline_step_ms
    assert sum(slot[0] for slot in merged.timeline.values()) == 3010
    assert Stats.from_dict(merged.to_dict()).timeline == merged.timeline


def test_the_page_is_self_contained_and_escapes_what_it_shows() -> None:
    stats = Stats()
    stats.add_outcome(outcome(1, 0.2), at=1000.0, request_format=OPENAI)
    page = render_report(summary_of(stats, job_id='<script>alert("x")</script>', error="bad & <b>worse</b>"))

    assert "<script" not in page.lower()
    assert "&lt;script&gt;" in page and "bad &amp; &lt;b&gt;worse&lt;/b&gt;" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page


def test_a_job_that_failed_before_any_request_still_gets_a_page() -> None:
    summary = {
        "job_id": "bad-0123",
        "status": "FAILED",
        "error": "sluice-mode='sideways'",
        "input": "s3://b/inbox/bad.jsonl",
    }
    tags = parse(render_report(summary))
    text = " ".join(tags.text)
    assert "sluice-mode='sideways'" in text and "No latency data" in text and "No throughput data" in text
    assert not tags.of("rect", "bar")


def test_a_failed_job_without_figures_never_says_nothing_was_sent() -> None:
    """A job whose accounting failed has no timeline, though every request may have been paid for."""
    summary = {
        "job_id": "big-0123",
        "status": "FAILED",
        "error": "States.TaskFailed; accounting for its lines failed too: Sandbox.Timedout",
        "input": "s3://b/inbox/big.jsonl",
        "counts": {"lines": 20, "blank": 0, "requests": 20, "results": 0, "errors": 20},
    }
    text = " ".join(parse(render_report(summary)).text)
    assert "nothing was sent to the provider" not in text
    assert "Requests may have been sent and paid for" in text


def test_files_next_to_the_report_are_linked_relatively() -> None:
    stats = Stats()
    stats.add_outcome(outcome(1, 0.2), at=1000.0, request_format=OPENAI)
    tags = parse(
        render_report(summary_of(stats), files={"results": "reviews.results.jsonl", "errors": "reviews.errors.jsonl"})
    )
    hrefs = [a.get("href") for t, a in tags.tags if t == "a"]
    assert hrefs == ["reviews.results.jsonl", "reviews.errors.jsonl"]


def _badge(page: Tags) -> str:
    [span] = [a for t, a in page.tags if t == "span" and "status" in (a.get("class") or "").split()]
    return (span.get("class") or "").split()[1]


@pytest.mark.parametrize(
    "status, results, errors, tone",
    [
        ("SUCCEEDED", 10, 0, "good"),
        ("SUCCEEDED", 9, 1, "warn"),
        ("SUCCEEDED", 5, 5, "bad"),
        ("COMPLETED_WITH_ERRORS", 8, 2, "warn"),
        ("COMPLETED_WITH_ERRORS", 2, 8, "bad"),
        ("FAILED", 10, 0, "bad"),
        ("CANCELLED", 3, 7, "bad"),
    ],
)
def test_the_badge_is_never_green_when_lines_failed(status: str, results: int, errors: int, tone: str) -> None:
    summary = summary_of(Stats(), status=status)
    summary["counts"] = {"requests": results + errors, "results": results, "errors": errors}
    page = parse(render_report(summary))
    assert _badge(page) == tone
    text = " ".join(page.text)
    if errors:
        assert f"{errors / (results + errors):.0%} of requests in errors ({errors} of {results + errors})" in text
    else:
        assert "in errors" not in text


def test_the_throughput_chart_names_its_lines() -> None:
    stats = Stats()
    stats.add_outcome(outcome(1, 0.1), at=1000.0, request_format=OPENAI)
    stats.add_outcome(outcome(2, 0.1, ok=False), at=1000.2, request_format=OPENAI)
    html = render_report(summary_of(stats))
    page = parse(html)
    labels = re.findall(r'<text class="legend-label"[^>]*>([^<]*)</text>', html)
    assert labels == ["results", "errors"]
    # each name sits next to a stroke drawn like its bars
    assert len(page.of("line", "legend-ok")) == 1 and len(page.of("line", "legend-err")) == 1
    only_results = Stats()
    only_results.add_outcome(outcome(1, 0.1), at=1000.0, request_format=OPENAI)
    assert not parse(render_report(summary_of(only_results))).of("line", "legend-err")


def test_each_error_code_shows_one_example_message_that_survives_the_merge() -> None:
    first, second = Stats(), Stats()
    failed = outcome(1, 0.1, ok=False)
    failed.error_message = "line 1: gave up after 6 attempts: HTTP 500 from the provider"
    first.add_outcome(failed, at=1000.0, request_format=OPENAI)
    second.add_error("invalid_json", "line 7, column 12: invalid JSON: unexpected character")
    second.add_error("invalid_json", "line 9: a later one")
    merged = Stats.from_dict(first.to_dict())
    merged.merge(Stats.from_dict(second.to_dict()))
    assert merged.error_examples == {
        "retries_exhausted": "line 1: gave up after 6 attempts: HTTP 500 from the provider",
        "invalid_json": "line 7, column 12: invalid JSON: unexpected character",
    }
    page = render_report(summary_of(merged, error_examples=merged.error_examples))
    rows = re.findall(r"<tr><td><code>([a-z_]+)</code></td><td>(\d+)</td><td>(.*?)</td></tr>", page)
    assert [(code, n) for code, n, _ in rows] == [("invalid_json", "2"), ("retries_exhausted", "1")]
    assert "unexpected character" in rows[0][2] and "HTTP 500" in rows[1][2]


def test_a_batch_job_shows_turnaround_and_says_why_there_is_no_request_latency() -> None:
    stats = Stats()
    for n in range(4):
        stats.add_outcome(outcome(n, 0.0), at=1000.0, timed=False, request_format=OPENAI)
    assert stats.latency_histogram() == [] and stats.results == 4
    summary = summary_of(stats, mode="batch")
    summary["shards"] = [
        {"shard": 0, "mode": "batch", "batch": {"batches": [{"id": "b1", "status": "completed", "turnaround_s": 0.0}]}},
        {
            "shard": 1,
            "mode": "batch",
            "batch": {"batches": [{"id": "b2", "status": "completed", "turnaround_s": 300.0}]},
        },
    ]
    page = parse(render_report(summary))
    text = " ".join(page.text)
    assert not page.of("rect", "bar")
    assert "No per-request latency" in text and "Batch turnaround" in text
    assert "5.0 min" in text  # the longest batch
    summary["shards"] = [summary["shards"][0]]
    assert "whole seconds" in " ".join(parse(render_report(summary)).text)


def test_the_batch_saving_is_shown_and_a_direct_job_learns_what_batch_would_cost() -> None:
    stats = Stats()
    stats.add_outcome(outcome(1, 0.1), at=1000.0, request_format=OPENAI)
    costs = {
        "provider": 0.006,
        "provider_all_direct": 0.010,
        "provider_all_batch": 0.005,
        "batch_savings": 0.004,
        "aws": 0.0003,
    }
    text = " ".join(parse(render_report(summary_of(stats, cost_estimate_usd=costs))).text)
    assert "saved by the Batch API" in text and "$0.0040 (40%)" in text
    assert "the same tokens, all sent directly" in text and "$0.0100" in text
    direct = {**costs, "provider": 0.010, "batch_savings": 0.0}
    text = " ".join(parse(render_report(summary_of(stats, cost_estimate_usd=direct))).text)
    assert "saved by the Batch API" not in text
    assert "would have cost $0.0050 at the provider instead of $0.0100" in text


def test_the_last_sweep_shows_what_it_sent_again_and_recovered_per_job_and_shard() -> None:
    summary: dict[str, Any] = {
        "job_id": "swept-0123",
        "status": "COMPLETED_WITH_ERRORS",
        "counts": {"requests": 20, "results": 18, "errors": 2},
        "sweep": {"swept": 5, "recovered": 3},
        "shards": [
            {
                "shard": 0,
                "mode": "direct",
                "first_line": 1,
                "lines": 10,
                "results": 10,
                "errors": 0,
                "swept": 3,
                "recovered": 3,
            },
            {
                "shard": 1,
                "mode": "direct",
                "first_line": 11,
                "lines": 10,
                "results": 8,
                "errors": 2,
                "swept": 2,
                "recovered": 0,
            },
        ],
    }
    text = " ".join(parse(render_report(summary)).text)
    assert "lines swept (last pass)" in text and "recovered by the sweep" in text
    tiles = re.findall(r'<div class="v">([^<]*)</div><div class="k">([^<]*)</div>', render_report(summary))
    assert ("5", "lines swept (last pass)") in tiles and ("3", "recovered by the sweep") in tiles
    rows = re.findall(r"<tr>(.*?)</tr>", render_report(summary))
    assert any("<th>swept</th><th>recovered</th>" in row for row in rows)
    assert "<td>2</td><td>0</td>" in rows[-1]
    # a job the sweep never touched says so, and its shard table has no sweep columns
    quiet = {**summary, "sweep": {"swept": 0, "recovered": 0}, "shards": [{**s, "swept": 0} for s in summary["shards"]]}
    page = render_report(quiet)
    assert ("0", "lines swept (last pass)") in re.findall(
        r'<div class="v">([^<]*)</div><div class="k">([^<]*)</div>', page
    )
    assert "<th>swept</th>" not in page and "recovered by the sweep" not in page


def test_a_run_the_cache_answered_whole_shows_no_rate_and_says_why_there_is_no_latency() -> None:
    stats = Stats()
    for _ in range(10):
        stats.add_cached("gpt-4o-mini", 10, 2)
    summary = summary_of(stats, cache={"mode": "on", "hits": 10, "misses": 0, "saved_usd": 0.00001})
    summary["lines_by_path"] = {"cache": 10}
    text = " ".join(parse(render_report(summary)).text)
    assert "req/s" not in text and "none were sent" in text
    assert "the response cache answered every line, so nothing was sent" in text
    assert "no request got an answer" not in text


def test_the_page_shows_how_the_job_ran_and_its_budget() -> None:
    stats = Stats()
    stats.add_outcome(outcome(1, 0.1), at=1000.0, request_format=OPENAI)
    run = {
        "provider": "http://127.0.0.1:8000/v1",
        "mode": "direct",
        "model": None,
        "concurrency": 50,
        "map_concurrency": 10,
        "shard_lines": 5000,
        "max_attempts": 6,
        "request_timeout_s": 120.0,
        "budget_usd": 5.0,
    }
    budget = {"cap_usd": 5.0, "spent_usd": 4.2e-05, "unsent_lines": 0}
    page = render_report(summary_of(stats, run=run, budget=budget, max_error_rate=0.0, command_seconds=4.3))
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", page))
    assert rows["provider"] == "http://127.0.0.1:8000/v1"
    assert rows["requests in flight (concurrency)"] == "50"
    assert rows["sends a line at most (last sweep included)"] == "6"
    assert rows["budget"] == "$0.000042 spent of $5.00"
    tiles = dict((k, v) for v, k in re.findall(r'<div class="v">([^<]*)</div><div class="k">([^<]*)</div>', page))
    assert tiles["job wall time (Plan to Merge)"] == "2.0 s"
    assert tiles["sluice run in all, with the local cloud"] == "4.3 s"


def test_the_longest_lines_attempts_survive_the_merge_and_show_and_no_cap_reads_as_the_job_needs() -> None:
    first, second = Stats(), Stats()
    retried = outcome(1, 0.1)
    retried.attempts = 9
    first.add_outcome(retried, at=1000.0, request_format=OPENAI)
    second.add_outcome(outcome(2, 0.1), at=1000.0, request_format=OPENAI)
    merged = Stats.from_dict(first.to_dict())
    merged.merge(Stats.from_dict(second.to_dict()))
    assert merged.max_attempts == 9
    run = {"mode": "direct", "max_attempts": 0}
    page = render_report(summary_of(merged, max_line_attempts=merged.max_attempts, run=run))
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", page))
    assert rows["sends a line at most (last sweep included)"] == "as the job needs"
    tiles = dict((k, v) for v, k in re.findall(r'<div class="v">([^<]*)</div><div class="k">([^<]*)</div>', page))
    assert tiles["attempts of the longest line"] == "9"


def test_the_run_end_says_the_longest_lines_attempts_and_why_lines_ended_in_errors() -> None:
    summary = {
        "max_line_attempts": 22,
        "errors_by_code": {"invalid_json": 1, "retries_exhausted": 2, "provider_refused": 5},
        "error_examples": {
            "retries_exhausted": "gave up after 22 attempts (3, then 19 in the shard's last sweep), ...",
            "invalid_json": "line 7: invalid JSON",
        },
    }
    assert longest(summary) == ", the longest line 22 attempts"
    assert longest({"max_line_attempts": 1}) == longest({}) == ""
    # a refusal has lines of its own (`refusal_lines`)
    assert error_lines(summary) == [
        "2 retries_exhausted: gave up after 22 attempts (3, then 19 in the shard's last sweep), ...",
        "1 invalid_json: line 7: invalid JSON",
    ]


def test_a_validating_job_shows_how_its_lines_ended_and_the_checks_that_turned_answers_down() -> None:
    stats = Stats()
    validation = {"valid_first_time": 1596, "repaired": 404, "invalid": 0, "failed_json": 120, "failed_schema": 248}
    page = render_report(summary_of(stats, validation=validation))
    assert "1,596 valid first time, 404 repaired, 0 invalid; answers turned down: 120 json, 248 schema" in page
    assert "output validation" not in render_report(summary_of(stats))


def test_percentile_labels_in_neighbouring_buckets_never_overprint() -> None:
    """Over five decades a bucket is a few pixels wide: p50, p95 and p99 in three buckets side by
    side were drawn on one row, over each other."""
    stats = Stats()
    latencies = [0.0011] + [0.1] * 100 + [0.115] * 90 + [0.13] * 8 + [60.0]
    for n, latency in enumerate(latencies):
        stats.add_outcome(outcome(n, latency), at=1000.0, request_format=OPENAI)
    page = parse(render_report(summary_of(stats)))

    assert len(page.of("line", "pct")) == 3
    labels = page.of("text", "pct-label")
    assert len(labels) == 3
    spans: dict[str, list[tuple[float, float]]] = {}
    for label, name in zip(labels, ("p50", "p95", "p99"), strict=True):
        x = float(label["x"] or 0)
        # an 11 px character is at most 7 px wide
        width = 7.0 * len(name)
        span = (x - width, x) if label["text-anchor"] == "end" else (x, x + width)
        row = spans.setdefault(str(label["y"]), [])
        assert all(span[1] < a or span[0] > b for a, b in row), (name, span, row)
        row.append(span)
    assert len(spans) > 1


def test_the_retries_are_shown_by_cause() -> None:
    stats = Stats()
    summary = summary_of(stats, retries_by_cause={"throttled": 4, "server_error": 3, "connection": 2})
    text = " ".join(parse(render_report(summary)).text)
    assert "3 retried after a 5xx" in text and "2 retried after a lost connection or timeout" in text
