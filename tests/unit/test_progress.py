"""`sluice run`'s live progress: counts that move with every line, and the line that shows them."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
from sluice.contract.model import Outcome
from sluice.shard.frame import ShardSpec
from sluice.shard.parts import PartWriter

from sluice_local.progress import Display, LiveCounts, RateMeter, Snapshot, clock, compact, format_line


def _answer(line: int, *, tokens_in: int = 10, tokens_out: int = 2, model: str = "gpt-4o-mini") -> Outcome:
    body = {"model": model, "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out}}
    return Outcome(line, f"c-{line}", 200, body, "req", attempts=1, latency_s=0.1)


def _failure(line: int, throttled: int = 0) -> Outcome:
    return Outcome(
        line,
        f"c-{line}",
        429,
        None,
        None,
        error_code="retries_exhausted",
        error_message="429",
        attempts=3,
        throttled=throttled,
    )


def _snapshot(**changes: Any) -> Snapshot:
    base: dict[str, Any] = {
        "total": 2000,
        "results": 990,
        "errors": 10,
        "waiting": 0,
        "tokens_in": 30_000,
        "tokens_out": 1_500,
        "cost_usd": 0.0054,
        "throttled": 7,
        "elapsed_s": 12.4,
    }
    return Snapshot(**{**base, **changes})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_counts_move_with_every_line_and_price_tokens_as_the_summary_does() -> None:
    now = Clock()
    counts = LiveCounts(clock=now)
    counts.total = 4
    assert counts.snapshot().done == 0

    counts.outcome(_answer(1, tokens_in=1_000_000, tokens_out=0), batch=False, waited=False)
    first = counts.snapshot()
    assert (first.done, first.results, first.tokens) == (1, 1, 1_000_000)
    # gpt-4o-mini lists $0.15 per million input tokens; the Batch API is half that
    assert first.cost_usd == pytest.approx(0.15)
    counts.outcome(_answer(2, tokens_in=1_000_000, tokens_out=0), batch=True, waited=False)
    assert counts.snapshot().cost_usd == pytest.approx(0.225)

    counts.outcome(_failure(3, throttled=2), batch=False, waited=False)
    counts.invalid("invalid_json")
    now.now += 3
    last = counts.snapshot()
    assert (last.done, last.results, last.errors, last.throttled) == (4, 2, 2, 2)
    assert last.elapsed_s == pytest.approx(3)


def test_lines_at_the_provider_count_down_as_their_answers_arrive() -> None:
    counts = LiveCounts()
    counts.total = 3
    counts.waiting(3)
    assert counts.snapshot().waiting == 3
    counts.outcome(_answer(1), batch=True, waited=True)
    assert counts.snapshot().waiting == 2
    # a batch that ended leaving a row unanswered hands it back (the shard sends it directly)
    counts.waiting(-1)
    counts.outcome(_answer(2), batch=True, waited=True)
    assert counts.snapshot().waiting == 0


def test_a_line_reported_twice_never_shows_more_than_the_total() -> None:
    counts = LiveCounts()
    counts.total = 1
    counts.outcome(_answer(1), batch=False, waited=False)
    counts.outcome(_answer(1), batch=False, waited=False)
    assert counts.snapshot().done == 1


def test_unknown_models_have_no_cost_rather_than_a_wrong_one() -> None:
    counts = LiveCounts()
    counts.outcome(_answer(1, model="my-local-llama"), batch=False, waited=False)
    assert counts.snapshot().cost_usd is None
    assert "(est.)" not in format_line(counts.snapshot(), rate=None, eta_s=None, width=120)


def test_the_line_shows_count_rate_eta_tokens_cost_and_429s() -> None:
    line = format_line(_snapshot(), rate=250.0, eta_s=4.0, width=140)
    assert line.startswith("0:12 1,000/2,000  50% |")
    for part in ("250 req/s", "ETA 0:04", "10 errors", "31.5k tokens", "$0.0054 (est.)", "429s: 7"):
        assert part in line, (part, line)
    assert len(line) <= 140


def test_a_narrow_terminal_drops_the_bar_then_the_least_important_figures() -> None:
    wide = format_line(_snapshot(), rate=250.0, eta_s=4.0, width=140)
    narrow = format_line(_snapshot(), rate=250.0, eta_s=4.0, width=60)
    assert "|" in wide and "|" not in narrow
    assert len(narrow) <= 60
    assert narrow.startswith("0:12 1,000/2,000  50% · 250 req/s · ETA 0:04")
    assert "429s" not in narrow


def test_background_and_batch_show_what_the_provider_still_holds() -> None:
    line = format_line(_snapshot(waiting=1000, results=1000, errors=0), rate=0.0, eta_s=None, width=160)
    assert "1,000 at the provider" in line
    assert "ETA ?" in line


def test_once_every_line_is_done_the_line_says_the_outputs_are_being_written() -> None:
    line = format_line(_snapshot(results=1990, errors=10), rate=5.0, eta_s=0.0, width=160)
    assert "2,000/2,000 100%" in line and "writing the outputs" in line and "ETA" not in line


def test_before_plan_has_counted_the_lines_the_line_says_so() -> None:
    assert format_line(_snapshot(total=None), rate=None, eta_s=None, width=100, phase="planning") == "0:12 planning…"


def test_rate_is_over_the_last_seconds_so_a_stall_shows() -> None:
    meter = RateMeter(window_s=10)
    for second in range(11):
        meter.add(float(second), second * 100)
    assert meter.rate() == pytest.approx(100)
    assert meter.eta_s(500) == pytest.approx(5)
    for second in range(11, 31):
        meter.add(float(second), 1000)
    assert meter.rate() == 0
    assert meter.eta_s(500) is None
    assert meter.eta_s(0) == 0


def test_number_and_time_formats() -> None:
    assert [compact(n) for n in (7, 999, 1_000, 31_500, 2_400_000)] == ["7", "999", "1.0k", "31.5k", "2.4M"]
    assert [clock(s) for s in (None, 0.4, 65, 3_725)] == ["?", "0:00", "1:05", "1:02:05"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_display_redraws_on_its_own_while_nothing_else_happens() -> None:
    counts = LiveCounts()
    counts.total = 10
    screen = Terminal()
    with Display(counts, stream=screen, refresh_s=0.05, width=lambda: 100):
        time.sleep(0.3)
        counts.outcome(_answer(1), batch=False, waited=False)
        time.sleep(0.3)
    frames = [f for f in screen.getvalue().split("\r") if f.strip("\x1b[K")]
    assert len(frames) >= 8
    assert any("0/10" in f for f in frames) and any("1/10" in f for f in frames)
    # the line is wiped at the end, so what follows starts on a clean line
    assert screen.getvalue().endswith("\r\x1b[K")


def test_the_plan_is_shown_the_moment_the_job_starts_not_at_the_next_redraw() -> None:
    screen = Terminal()
    display = Display(LiveCounts(), stream=screen, refresh_s=60, width=lambda: 100)
    with display.starting("starting the local cloud"), display:
        frames = [f for f in screen.getvalue().split("\r") if f.strip("\x1b[K")]
    assert "starting the local cloud" in frames[0]
    assert "planning" in frames[-1]


@pytest.mark.parametrize("quiet, stream", [(True, Terminal()), (False, io.StringIO())])
def test_quiet_or_off_a_terminal_draws_nothing(quiet: bool, stream: io.StringIO) -> None:
    counts = LiveCounts()
    counts.total = 1
    with Display(counts, stream=stream, quiet=quiet, refresh_s=0.01):
        counts.outcome(_answer(1), batch=False, waited=False)
        time.sleep(0.05)
    assert stream.getvalue() == ""


class FakeS3:
    def __init__(self) -> None:
        self.puts = 0

    def put_object(self, **_: Any) -> None:
        self.puts += 1


class FakeStore:
    def __init__(self) -> None:
        self.writes = 0

    def record_progress(self, *_: Any, **__: Any) -> None:
        self.writes += 1

    def settle_early(self, *_: Any, **__: Any) -> None:
        self.writes += 1


def test_a_shard_reports_each_line_at_once_and_no_aws_request_more() -> None:
    spec = ShardSpec("job", 0, "b", "k", "e", 0, 100, 1, 10, "direct", 10, 3)
    s3, store = FakeS3(), FakeStore()
    counts = LiveCounts()
    writer = PartWriter(s3=s3, store=store, spec=spec, run=1, item_rows_for_results=False, progress=counts)  # type: ignore[arg-type]
    for line in range(1, 6):
        writer.add_outcome(_answer(line))
        assert counts.snapshot().done == line
    writer.add_outcome(_failure(6))
    # nothing checkpointed yet (a part every 1,000 lines or 3 s), and the display already knows
    assert (s3.puts, store.writes) == (0, 0)
    assert (counts.snapshot().results, counts.snapshot().errors) == (5, 1)
    writer.flush(finished=False)
    quiet_s3, quiet_store = FakeS3(), FakeStore()
    silent = PartWriter(s3=quiet_s3, store=quiet_store, spec=spec, run=1, item_rows_for_results=False)  # type: ignore[arg-type]
    for line in range(1, 6):
        silent.add_outcome(_answer(line))
    silent.add_outcome(_failure(6))
    silent.flush(finished=False)
    # the same requests with the sink as without it: one part (two PUTs), one checkpoint write
    assert (s3.puts, store.writes) == (quiet_s3.puts, quiet_store.writes) == (2, 1)


def test_a_note_takes_the_status_line_off_first_and_the_next_redraw_puts_it_back() -> None:
    stream = io.StringIO()
    display = Display(LiveCounts(), stream=stream, width=lambda: 120)
    display.enabled = True
    display.draw()
    display.note("job j started")
    display.draw()
    lines = stream.getvalue().split("\n")
    assert lines[0].endswith("\r\x1b[Kjob j started")
    assert lines[1].startswith("\r") and "planning" in lines[1]


def test_no_eta_from_one_slow_first_answer_and_no_100_percent_before_the_end() -> None:
    meter = RateMeter(window_s=10)
    meter.add(0.0, 0)
    meter.add(5.0, 1)  # the first request went out alone and took 5 s
    assert meter.eta_s(1999) is None
    line = format_line(_snapshot(results=1990, errors=0), rate=meter.rate(), eta_s=meter.eta_s(10), width=160)
    assert "1,990/2,000  99%" in line and "ETA ?" in line


def test_the_rate_leaves_out_what_the_cache_answered() -> None:
    now = Clock()
    counts = LiveCounts(clock=now)
    counts.total = 2000
    display = Display(counts, stream=io.StringIO(), width=lambda: 160)
    display.render()
    counts.cached(1990)
    now.now += 1
    line = display.render()
    assert "— req/s" in line or " 0 req/s" in line, line


def test_a_small_cost_keeps_two_significant_digits() -> None:
    from sluice_local.console import human_usd

    assert [human_usd(v) for v in (4.2e-05, 0.0077, 0.5, 12.5, 0)] == [
        "$0.000042",
        "$0.0077",
        "$0.5000",
        "$12.50",
        "$0",
    ]


def test_the_line_shows_a_validating_jobs_repaired_and_invalid_lines() -> None:
    counts = LiveCounts(clock=Clock())
    counts.total = 3
    repaired = _answer(1, tokens_in=10, tokens_out=1)
    repaired.validation = "repaired"
    invalid = _failure(2)
    invalid.validation = "invalid"
    valid = _answer(3, tokens_in=10, tokens_out=1)
    valid.validation = "valid_first_time"
    for outcome in (repaired, invalid, valid):
        counts.outcome(outcome, batch=False, waited=False)
    snapshot = counts.snapshot()
    assert (snapshot.repaired, snapshot.invalid_output) == (1, 1)
    line = format_line(snapshot, rate=1.0, eta_s=None, width=200)
    assert "1 repaired" in line and "1 invalid" in line
