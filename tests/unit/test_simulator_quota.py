"""The simulator's quota mode: per-key RPM and TPM buckets, as a third-party provider enforces them."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from sluice_local.sim_options import add_options, config_from
from sluice_local.simulator import ApiError, SimConfig, SimulatorServer, answer_for, count_tokens
from sluice_local.simulator.limits import Limiter, fmt_duration


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 5_000.0

    def __call__(self) -> float:
        return self.t


def rejected(limiter: Limiter, config: SimConfig, key: str, tokens: int = 1) -> ApiError:
    with pytest.raises(ApiError) as caught:
        limiter.admit(config, key, tokens)
    return caught.value


def test_a_full_bucket_lets_exactly_rpm_through_then_retry_after_is_the_real_wait() -> None:
    clock = Clock()
    limiter, config = Limiter(clock), SimConfig(quota_rpm=6)
    for _ in range(6):
        limiter.admit(config, "sk-a", 1)
    err = rejected(limiter, config, "sk-a")
    assert err.status == 429
    assert err.body["error"]["type"] == "requests"
    assert err.body["error"]["code"] == "rate_limit_exceeded"
    # 6 a minute refill one request every 10 s
    assert err.headers == {"retry-after": "10", "retry-after-ms": "10000"}
    clock.t += 9.9
    assert rejected(limiter, config, "sk-a").headers == {"retry-after": "1", "retry-after-ms": "100"}
    clock.t += 0.1
    limiter.admit(config, "sk-a", 1)
    assert rejected(limiter, config, "sk-a").headers["retry-after"] == "10"


def test_the_buckets_refill_continuously_up_to_their_capacity() -> None:
    clock = Clock()
    limiter, config = Limiter(clock), SimConfig(quota_rpm=60)

    def admitted() -> int:
        count = 0
        while True:
            try:
                limiter.admit(config, "sk-a", 1)
            except ApiError:
                return count
            count += 1

    assert admitted() == 60
    clock.t += 30.0
    assert admitted() == 30
    clock.t += 0.25
    assert admitted() == 0
    clock.t += 0.75
    assert admitted() == 1
    clock.t += 600.0
    assert admitted() == 60


def test_a_drained_key_sends_at_its_rate_with_no_minute_to_spend_at_once() -> None:
    clock = Clock()
    limiter, config = Limiter(clock), SimConfig(quota_rpm=60)
    limiter.drain(config, "sk-a")
    assert rejected(limiter, config, "sk-a").headers["retry-after"] == "1"
    assert limiter.headers(config, "sk-a")["x-ratelimit-remaining-requests"] == "0"
    clock.t += 1.0
    limiter.admit(config, "sk-a", 1)
    # another key keeps its own full minute
    for _ in range(60):
        limiter.admit(config, "sk-b", 1)


def test_the_token_bucket_rejects_what_does_not_fit_and_says_tokens() -> None:
    clock = Clock()
    limiter, config = Limiter(clock), SimConfig(quota_tpm=120)
    limiter.admit(config, "sk-a", 50)
    limiter.admit(config, "sk-a", 50)
    err = rejected(limiter, config, "sk-a", 50)
    assert err.body["error"]["type"] == "tokens"
    assert err.body["error"]["code"] == "rate_limit_exceeded"
    # 20 left, 30 more needed at 2 tokens a second
    assert err.headers == {"retry-after": "15", "retry-after-ms": "15000"}
    clock.t += 15.0
    limiter.admit(config, "sk-a", 50)


def test_keys_have_their_own_quota_and_the_server_wide_limit_is_shared() -> None:
    clock = Clock()
    limiter, config = Limiter(clock), SimConfig(quota_rpm=2)
    for _ in range(2):
        limiter.admit(config, "sk-a", 1)
    rejected(limiter, config, "sk-a")
    for _ in range(2):
        limiter.admit(config, "sk-b", 1)
    rejected(limiter, config, "sk-b")

    server_wide = SimConfig(rpm_limit=2)
    limiter = Limiter(clock)
    limiter.admit(server_wide, "sk-a", 1)
    limiter.admit(server_wide, "sk-b", 1)
    rejected(limiter, server_wide, "sk-c")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0s"), (0.02, "20ms"), (0.0201, "21ms"), (1.0, "1s"), (1.5, "1.5s"), (360.0, "6m0s"), (3725.0, "1h2m5s")],
)
def test_reset_durations_are_in_openais_format(seconds: float, text: str) -> None:
    assert fmt_duration(seconds) == text


def test_quota_settings_are_checked_and_come_from_the_options() -> None:
    with pytest.raises(ValueError):
        SimConfig(quota_rpm=-1)
    parser = argparse.ArgumentParser()
    add_options(parser)
    assert config_from(parser.parse_args(["--quota-rpm", "1200", "--quota-tpm", "400000"])) == SimConfig(
        quota_rpm=1200, quota_tpm=400_000
    )


# over HTTP, with the quota's clock held still

RPM, TPM = 5, 10_000
CLOCK = Clock()


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimConfig(latency_s=0.0), clock=CLOCK) as running:
        yield running


@pytest.fixture
def sim(server: SimulatorServer) -> SimulatorServer:
    server.reset()
    server.configure(quota_rpm=RPM, quota_tpm=TPM)
    return server


def post(sim: SimulatorServer, key: str, text: str = "Say something.") -> tuple[int, dict[str, str], Any]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    request = urllib.request.Request(f"{sim.base_url}/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status, head, raw = answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as err:
        status, head, raw = err.code, dict(err.headers), err.read()
    return status, {k.lower(): v for k, v in head.items()}, json.loads(raw)


def test_every_answer_carries_consistent_rate_limit_headers(sim: SimulatorServer) -> None:
    text = "Say something."
    cost = count_tokens(text) + count_tokens(answer_for(text))
    for sent in range(1, RPM + 1):
        status, headers, _ = post(sim, "sk-a", text)
        assert status == 200
        assert headers["x-ratelimit-limit-requests"] == str(RPM)
        assert headers["x-ratelimit-remaining-requests"] == str(RPM - sent)
        assert headers["x-ratelimit-reset-requests"] == fmt_duration(sent * 60 / RPM)
        assert headers["x-ratelimit-limit-tokens"] == str(TPM)
        assert headers["x-ratelimit-remaining-tokens"] == str(TPM - sent * cost)
        assert headers["x-ratelimit-reset-tokens"] == fmt_duration(sent * cost * 60 / TPM)
    status, headers, body = post(sim, "sk-a", text)
    assert status == 429
    assert body["error"]["type"] == "requests"
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("12", "12000")
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "1m0s"
    # a rejected request takes no tokens
    assert headers["x-ratelimit-remaining-tokens"] == str(TPM - RPM * cost)
    assert sim.log[-1]["fault"] == "rate_limit"
    with pytest.raises(openai.RateLimitError):
        openai.OpenAI(base_url=sim.base_url, api_key="sk-a", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": text}]
        )


def test_two_keys_do_not_share_a_quota_and_one_key_refills_over_time(sim: SimulatorServer) -> None:
    for _ in range(RPM):
        assert post(sim, "sk-a")[0] == 200
    assert post(sim, "sk-a")[0] == 429
    status, headers, _ = post(sim, "sk-b")
    assert status == 200
    assert headers["x-ratelimit-remaining-requests"] == str(RPM - 1)
    CLOCK.t += 60 / RPM
    status, headers, _ = post(sim, "sk-a")
    assert status == 200
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert post(sim, "sk-a")[0] == 429
