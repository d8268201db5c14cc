"""`sluice run`'s signal handling: what a signal does before the job starts and while it runs."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from sluice_local.interrupt import SIGNALS, Interrupted, Signals


@pytest.fixture
def signals() -> Iterator[Signals]:
    # as at a terminal, whatever the runner of the suite ignores (nohup, a background job)
    before = {signum: signal.signal(signum, signal.SIG_DFL) for signum in SIGNALS}
    handlers = Signals()
    handlers.install()
    try:
        yield handlers
    finally:
        handlers.restore()
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    # the handler runs between two bytecodes of the main thread
    signal.getsignal(signum)


def test_a_hang_up_before_the_job_starts_stops_at_once_with_exit_129(signals: Signals) -> None:
    with pytest.raises(Interrupted) as stopped:
        _deliver(signal.SIGHUP)
    assert stopped.value.exit_code == 129


def test_while_the_job_runs_a_signal_is_recorded_and_the_next_ones_say_what_is_going_on(
    signals: Signals, capsys: pytest.CaptureFixture[str]
) -> None:
    signals.job_started()
    signals.check()
    _deliver(signal.SIGTERM)
    with pytest.raises(Interrupted) as stopped:
        signals.check()
    assert stopped.value.exit_code == 143

    since_first = signals.since(1)
    signals.doing("still writing the outputs")
    assert not since_first()
    _deliver(signal.SIGINT)
    _deliver(signal.SIGHUP)
    assert since_first()
    assert capsys.readouterr().err.count("still writing the outputs") == 2
    # the first signal decides the exit code, whatever came after it
    with pytest.raises(Interrupted) as again:
        signals.check()
    assert again.value.exit_code == 143


def test_an_ignored_signal_stays_ignored_and_restore_puts_the_previous_handlers_back() -> None:
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    previous_term = signal.getsignal(signal.SIGTERM)
    try:
        handlers = Signals()
        handlers.install()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN  # as under nohup
        assert signal.getsignal(signal.SIGTERM) != previous_term
        handlers.restore()
        assert signal.getsignal(signal.SIGTERM) == previous_term
    finally:
        signal.signal(signal.SIGHUP, before)
