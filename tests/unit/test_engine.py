from __future__ import annotations

import asyncio
import ctypes
import itertools
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from sluice.contract.model import ErrorCode, Outcome, Request
from sluice.core.retry import RetryPolicy
from sluice.send.engine import EngineSettings, EngineStats, fan_out, make_session

from tests.unit.helpers.engine import FAST, Action, Run, Scripted, run, serve


def chat(i: int, cid: str | None = None) -> Request:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}], "vendor_extra": {"x": 1}})
    return Request(line=i + 1, custom_id=cid or f"r{i}", method="POST", path="/v1/chat/completions", body=body)


def scenario(provider: Scripted, requests: Any, **kw: Any) -> Run:
    async def go() -> Run:
        async with serve(provider):
            return await run(provider, requests, **kw)

    return asyncio.run(go())


def test_success_path_sends_body_untouched_and_records_outcome() -> None:
    reqs = [chat(i) for i in range(20)]
    r = scenario(Scripted(), reqs)
    assert r.stats.succeeded == 20 and r.stats.failed == 0 and r.stats.retries == 0
    assert r.stats.sent == 20 and r.stats.attempts == 20 and not r.stats.stopped_early
    by_cid = {o.custom_id: o for o in r.outcomes}
    assert len(by_cid) == 20
    o = by_cid["r3"]
    assert o.ok and o.status_code == 200 and o.line == 4 and o.attempts == 1
    assert o.body["id"] == "chatcmpl-r3"
    assert o.request_id == "req-r3-0"
    assert o.latency_s > 0


def test_request_shape_on_the_wire() -> None:
    provider = Scripted()
    req = chat(0)
    scenario(provider, [req])
    (entry,) = provider.log
    assert entry["path"] == "/v1/chat/completions" and entry["method"] == "POST"
    assert entry["body"] == req.body  # provider-specific fields pass through byte for byte
    assert entry["headers"]["Authorization"] == "Bearer sk-test"
    assert entry["headers"]["Content-Type"] == "application/json"
    assert entry["headers"]["x-sluice-custom-id"] == "r0"


def test_request_id_falls_back_to_body_id() -> None:
    provider = Scripted(script={"r0": [("status", 200, {}, {"id": "resp_9", "status": "queued"})]})
    r = scenario(provider, [chat(0)])
    assert r.outcomes[0].request_id == "resp_9"


def test_429_with_retry_after_ms_is_honoured() -> None:
    provider = Scripted(
        script={"r0": [("status", 429, {"retry-after-ms": "1500"}, {"error": {"message": "slow down"}})] * 2}
    )
    policy = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05, request_timeout_s=1)
    r = scenario(provider, [chat(0)], policy=policy)
    (o,) = r.outcomes
    assert o.ok and o.attempts == 3 and o.throttled == 2
    # the hint is above max_delay_s and is still honoured exactly
    assert r.delays == [1.5, 1.5]
    assert r.stats.throttled_429 == 2 and r.stats.retries == 2


def test_500_then_success() -> None:
    provider = Scripted(script={"r0": [("status", 500, {}, {"error": {"message": "boom"}})]})
    r = scenario(provider, [chat(0)])
    (o,) = r.outcomes
    assert o.ok and o.attempts == 2 and o.request_id == "req-r0-1"
    assert r.stats.server_errors == 1
    # full jitter with rand=0.5 on attempt 1: half the base delay
    assert r.delays == [pytest.approx(0.005)]


def test_dropped_connection_then_success() -> None:
    provider = Scripted(script={"r0": [("drop",)]})
    r = scenario(provider, [chat(0)])
    (o,) = r.outcomes
    assert o.ok and o.attempts == 2
    assert r.stats.connection_errors == 1


def test_a_lines_retries_are_counted_by_what_they_met() -> None:
    """A 429, a 500 and a dropped connection before the answer: each counted under its cause, which
    the summary and the report then show apart."""
    provider = Scripted(
        script={
            "r0": [
                ("status", 429, {"retry-after-ms": "1"}, {"error": {"message": "slow down"}}),
                ("status", 500, {}, {"error": {"message": "boom"}}),
                ("drop",),
            ]
        }
    )
    r = scenario(provider, [chat(0)], policy=RetryPolicy(max_attempts=6, base_delay_s=0.001))
    (o,) = r.outcomes
    assert o.ok and o.attempts == 4
    assert (o.throttled, o.server_errors, o.lost) == (1, 1, 1)


def test_timeout_then_success() -> None:
    provider = Scripted(script={"r0": [("hang", 2.0)]})
    policy = RetryPolicy(max_attempts=3, base_delay_s=0.01, request_timeout_s=0.3)
    r = scenario(provider, [chat(0)], policy=policy)
    (o,) = r.outcomes
    assert o.ok and o.attempts == 2
    assert r.stats.connection_errors == 1


def test_retries_exhausted_reports_last_status_and_message() -> None:
    provider = Scripted(default=lambda _c, _n: ("status", 503, {}, {"error": {"message": "overloaded, try later"}}))
    r = scenario(provider, [chat(0)])
    (o,) = r.outcomes
    assert o.error_code == ErrorCode.RETRIES_EXHAUSTED
    assert o.attempts == FAST.max_attempts == provider.attempts["r0"]
    assert o.error_message is not None
    assert "503" in o.error_message and "overloaded, try later" in o.error_message
    assert o.status_code == 503 and o.body == {"error": {"message": "overloaded, try later"}}
    assert r.stats.failed == 1 and r.stats.error_codes == {ErrorCode.RETRIES_EXHAUSTED: 1}
    assert len(r.delays) == FAST.max_attempts - 1


def test_retries_exhausted_on_connection_errors_names_the_exception() -> None:
    provider = Scripted(default=lambda _c, _n: ("drop",))
    r = scenario(provider, [chat(0)])
    (o,) = r.outcomes
    assert o.error_code == ErrorCode.RETRIES_EXHAUSTED and o.status_code is None
    assert o.error_message is not None and "ServerDisconnectedError" in o.error_message


def test_400_is_a_provider_error_without_retry() -> None:
    err = {"error": {"message": "bad model", "type": "invalid_request_error", "code": "model_not_found"}}
    provider = Scripted(script={"r0": [("status", 400, {"x-request-id": "req-bad"}, err)]})
    r = scenario(provider, [chat(0)])
    (o,) = r.outcomes
    assert o.error_code == ErrorCode.PROVIDER_ERROR and o.attempts == 1
    assert o.status_code == 400 and o.body == err and o.request_id == "req-bad"
    assert o.error_message is not None and "bad model" in o.error_message
    assert provider.attempts["r0"] == 1 and r.delays == []


def test_queue_wait_exceeded_body_code_is_retried_like_429() -> None:
    err = {"error": {"message": "queue wait exceeded", "code": "queue_wait_exceeded"}}
    provider = Scripted(script={"r0": [("status", 400, {}, err)]})
    r = scenario(provider, [chat(0)])
    (o,) = r.outcomes
    assert o.ok and o.attempts == 2 and o.throttled == 1


def test_non_json_success_is_retried() -> None:
    provider = Scripted(script={"r0": [("raw", 200, b"<html>proxy hiccup</html>")]})
    r = scenario(provider, [chat(0)])
    assert r.outcomes[0].ok and r.outcomes[0].attempts == 2


def test_huge_retry_after_gives_up_with_reason() -> None:
    provider = Scripted(script={"r0": [("status", 429, {"retry-after": "86400"}, {})]})
    r = scenario(provider, [chat(0)])
    (o,) = r.outcomes
    assert o.error_code == ErrorCode.RETRIES_EXHAUSTED
    assert o.error_message is not None and "86400" in o.error_message
    assert r.delays == []


def test_should_stop_stops_taking_new_items_and_counts_the_rest() -> None:
    k = 10
    sunk: list[Outcome] = []
    reqs = [chat(i) for i in range(100)]
    r = scenario(Scripted(), iter(reqs), concurrency=4, should_stop=lambda: len(sunk) >= k, sink=sunk.append)
    assert r.stats.stopped_early
    # in-flight items finish, so up to concurrency-1 more than k may land
    assert k <= len(sunk) < k + 4
    assert r.stats.sent == len(sunk)
    assert r.stats.remaining == 100 - len(sunk)
    # nothing taken was lost, nothing was taken twice
    assert sorted(o.line for o in sunk) == list(range(1, len(sunk) + 1))


def test_should_stop_counts_remaining_by_len_for_sized_inputs() -> None:
    sunk: list[Outcome] = []
    reqs = [chat(i) for i in range(30)]
    r = scenario(Scripted(), reqs, concurrency=2, should_stop=lambda: len(sunk) >= 5, sink=sunk.append)
    assert r.stats.remaining == 30 - r.stats.sent


@pytest.mark.slow
def test_memory_is_bounded_by_concurrency_on_a_long_generator() -> None:
    concurrency = 64
    taken = 0
    sunk = 0
    peak = 0

    def source() -> Iterator[Request]:
        nonlocal taken, peak
        body = orjson.dumps({"model": "m", "messages": []})
        for i in range(20_000):
            taken += 1
            peak = max(peak, taken - sunk)
            yield Request(line=i + 1, custom_id=f"r{i}", method="POST", path="/v1/chat/completions", body=body)

    def sink(o: Outcome) -> None:
        nonlocal sunk
        assert o.ok
        sunk += 1

    provider = Scripted()
    r = scenario(provider, source(), concurrency=concurrency, sink=sink)
    assert sunk == taken == 20_000 == r.stats.succeeded
    assert peak <= concurrency
    assert provider.max_in_flight <= concurrency


def test_aimd_shrinks_once_per_burst_and_limits_in_flight() -> None:
    concurrency = 16
    # every first attempt is throttled: the whole first window answers 429 at once
    provider = Scripted(
        default=lambda _c, n: (
            ("status", 429, {"retry-after-ms": "0"}, {"error": {"message": "rl"}}) if n == 0 else ("ok",)
        )
    )
    r = scenario(provider, [chat(i) for i in range(concurrency)], concurrency=concurrency)
    assert all(o.ok for o in r.outcomes)
    assert r.stats.throttled_429 == concurrency
    assert r.stats.limit_min == concurrency // 2


@pytest.mark.slow
def test_aimd_holds_concurrency_down_under_sustained_throttling() -> None:
    concurrency = 32
    seen = itertools.count()

    def answer(_cid: str, _n: int) -> Action:
        # every other answer is a 429 for a while: the limit must come well down
        k = next(seen)
        return ("status", 429, {}, {}) if k < 300 and k % 2 == 0 else ("ok",)

    policy = RetryPolicy(max_attempts=50, base_delay_s=0.001, max_delay_s=0.002, request_timeout_s=1)
    r = scenario(Scripted(default=answer), [chat(i) for i in range(200)], concurrency=concurrency, policy=policy)
    assert all(o.ok for o in r.outcomes)
    assert r.stats.limit_min <= concurrency // 4


def test_fan_out_never_raises_on_a_dead_provider() -> None:
    async def go() -> Run:
        # nothing listens on this port
        provider = Scripted(base_url="http://127.0.0.1:9/v1")
        return await run(provider, [chat(i) for i in range(3)], policy=RetryPolicy(max_attempts=2, base_delay_s=0.001))

    r = asyncio.run(go())
    assert [o.error_code for o in r.outcomes] == [ErrorCode.RETRIES_EXHAUSTED] * 3
    assert r.stats.connection_errors == 6


def test_sink_exception_propagates() -> None:
    def bad_sink(_o: Outcome) -> None:
        raise RuntimeError("sink bug")

    with pytest.raises(RuntimeError, match="sink bug"):
        scenario(Scripted(), [chat(i) for i in range(5)], sink=bad_sink)


def test_standby_workers_keep_taking_items_while_others_sleep_out_a_retry() -> None:
    concurrency = 4
    taken = 0
    sunk = 0
    peak = 0

    def source() -> Iterator[Request]:
        nonlocal taken, peak
        for i in range(40):
            taken += 1
            peak = max(peak, taken - sunk)
            yield chat(i)

    def sink(o: Outcome) -> None:
        nonlocal sunk
        sunk += 1

    # r0 is throttled with a long Retry-After; with a real sleep, the other 39 must not wait for it
    provider = Scripted(script={"r0": [("status", 429, {"retry-after-ms": "400"}, {})]})

    async def go() -> tuple[EngineStats, float]:
        async with serve(provider), make_session(concurrency) as session:
            started = asyncio.get_running_loop().time()
            order: list[str] = []

            def record(o: Outcome) -> None:
                order.append(o.custom_id)
                sink(o)

            stats = await fan_out(
                source(),
                session=session,
                settings=EngineSettings(
                    concurrency=concurrency, policy=FAST, retry_headroom=0.5, base_url=provider.base_url, api_key="k"
                ),
                sink=record,
            )
            assert order[-1] == "r0"  # everything else finished during r0's wait
            return stats, asyncio.get_running_loop().time() - started

    stats, _elapsed = asyncio.run(go())
    assert stats.succeeded == 40 and stats.retries == 1
    # held items: at most concurrency working plus the one asleep (headroom is 2)
    assert peak <= concurrency + 1
    assert provider.max_in_flight <= concurrency


def test_without_headroom_held_items_never_exceed_concurrency_even_with_retries() -> None:
    concurrency = 4
    taken = sunk = peak = 0

    def source() -> Iterator[Request]:
        nonlocal taken, peak
        for i in range(40):
            taken += 1
            peak = max(peak, taken - sunk)
            yield chat(i)

    def sink(_o: Outcome) -> None:
        nonlocal sunk
        sunk += 1

    provider = Scripted(default=lambda _c, n: ("status", 500, {}, {}) if n == 0 else ("ok",))

    async def go() -> EngineStats:
        async with serve(provider), make_session(concurrency) as session:
            return await fan_out(
                source(),
                session=session,
                settings=EngineSettings(
                    concurrency=concurrency, policy=FAST, retry_headroom=0, base_url=provider.base_url, api_key="k"
                ),
                sink=sink,
            )

    stats = asyncio.run(go())
    assert stats.succeeded == 40 and stats.retries == 40
    assert peak <= concurrency


# Holds eight 256 KiB blocks (the size asyncio reads every response into) and prints how
# many of them glibc served with mmap, optionally after one empty fan_out.
_MMAP_PROBE = textwrap.dedent(
    """
    import asyncio, ctypes, sys

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    from sluice.send.engine import EngineSettings, fan_out, make_session

    async def empty_run():
        async with make_session(1) as session:
            await fan_out([], session=session, sink=print,
                          settings=EngineSettings(concurrency=1, base_url="http://127.0.0.1:9", api_key="k"))

    if sys.argv[1] == "fan_out":
        asyncio.run(empty_run())
    before = libc.mallinfo2().hblks
    held = [bytes(256 * 1024) for _ in range(8)]
    print(libc.mallinfo2().hblks - before)
    """
)


@pytest.mark.subprocess
@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="mallinfo2 is glibc's (2.33+)")
@pytest.mark.slow
def test_after_fan_out_response_sized_buffers_are_not_mmapped() -> None:
    def mmapped(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _MMAP_PROBE, mode],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": ":".join(sys.path)},
        )
        return int(out.stdout.strip().splitlines()[-1])

    # the premise: a fresh process maps each block on its own (a syscall pair per read)
    assert mmapped("control") >= 4
    assert mmapped("fan_out") == 0


def test_overlapping_engines_leave_the_collector_as_they_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local cloud runs many shards at once on threads of one process, and the collector is
    process-wide: the first engine in tunes it, the last out restores it, and the frozen objects
    are counted once, not once per shard (each count walks every frozen object)."""
    import gc
    import threading

    counted = 0
    count = gc.get_freeze_count

    def counting() -> int:
        nonlocal counted
        counted += 1
        return count()

    monkeypatch.setattr(gc, "get_freeze_count", counting)
    before = (gc.get_threshold(), gc.get_freeze_count())
    counted = 0
    both_running = threading.Barrier(2, timeout=10)
    seen: list[tuple[int, int, int]] = []
    finished: list[tuple[int | None, str | None]] = []

    def shard(n: int) -> None:
        def default(_cid: str, _n: int) -> Action:
            seen.append(gc.get_threshold())
            both_running.wait()
            return ("ok",)

        outcomes = scenario(Scripted(default=default), [chat(n)], concurrency=1).outcomes
        finished.extend((o.status_code, o.error_code) for o in outcomes)

    threads = [threading.Thread(target=shard, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert finished == [(200, None), (200, None)]
    assert len(seen) == 2 and all(threshold[0] >= 20_000 for threshold in seen)
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
    assert counted == 2  # once for the first engine in, once by this test
