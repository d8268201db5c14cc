"""The rate limits: continuously refilled token buckets, server-wide and per API key, and the x-ratelimit-* headers."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass

from sluice_local.simulator.config import SimConfig
from sluice_local.simulator.wire import ApiError, retry_headers

# Reported in x-ratelimit-* when no limit is configured: large enough that adaptive
# clients never throttle themselves, and still parseable as integers.
UNLIMITED_REQUESTS = 1_000_000
UNLIMITED_TOKENS = 1_000_000_000


def fmt_duration(seconds: float) -> str:
    """A wait in the Go-duration style OpenAI uses in x-ratelimit-reset-*: "0s", "20ms", "1.5s", "6m0s".

    Rounded up to the millisecond, so a client that waits this long is never early.
    """
    total_ms = math.ceil(round(seconds * 1000, 6)) if seconds > 0 else 0
    if total_ms == 0:
        return "0s"
    if total_ms < 1000:
        return f"{total_ms}ms"
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, millis = divmod(rest, 1000)
    text = f"{whole}.{millis:03d}".rstrip("0") + "s" if millis else f"{whole}s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    if minutes:
        return f"{minutes}m{text}"
    return text


class Bucket:
    """A token bucket refilled continuously: `per_minute` capacity, per_minute/60 per second."""

    __slots__ = ("capacity", "level", "rate", "stamp")

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity
        self.stamp = now

    def fill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_s(self, amount: float) -> float:
        need = min(amount, self.capacity) - self.level
        return need / self.rate if need > 0 else 0.0

    def take(self, amount: float) -> None:
        self.level -= min(amount, self.capacity)

    def reset_s(self) -> float:
        return (self.capacity - self.level) / self.rate


class _Pair:
    """The RPM and TPM buckets of one scope; a changed limit starts that bucket full again."""

    __slots__ = ("requests", "tokens")

    def __init__(self) -> None:
        self.requests: Bucket | None = None
        self.tokens: Bucket | None = None

    def filled(self, rpm: int, tpm: int, now: float) -> tuple[Bucket | None, Bucket | None]:
        if rpm and (self.requests is None or self.requests.capacity != rpm):
            self.requests = Bucket(rpm, now)
        if tpm and (self.tokens is None or self.tokens.capacity != tpm):
            self.tokens = Bucket(tpm, now)
        requests = self.requests if rpm else None
        tokens = self.tokens if tpm else None
        for bucket in (requests, tokens):
            if bucket is not None:
                bucket.fill(now)
        return requests, tokens


@dataclass(frozen=True, slots=True)
class Level:
    """Where one kind of limit stands for a key: its limit a minute, what is left, and the seconds
    until it is full again (each dialect writes its own headers from it)."""

    limit: int
    remaining: int
    reset_s: float


def key_id(api_key: str) -> str:
    """What a quota is kept under: a digest, so the key itself is not held."""
    return hashlib.blake2b(api_key.encode(), digest_size=12).hexdigest()


class Limiter:
    """The rate limits: server-wide (rpm_limit / tpm_limit) and per API key (quota_rpm / quota_tpm).

    Both kinds are token buckets, full at first use and refilled continuously. A request
    must fit every configured bucket and then takes from all of them; a rejected request
    takes nothing. `clock` is monotonic seconds (injected by tests).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._server = _Pair()
        self._keys: dict[str, _Pair] = {}

    def reset(self) -> None:
        self._server = _Pair()
        self._keys.clear()

    def _buckets(self, config: SimConfig, api_key: str) -> tuple[list[Bucket], list[Bucket]]:
        """The request buckets and the token buckets that apply to `api_key`, filled to now."""
        now = self._clock()
        scopes = [self._server.filled(config.rpm_limit, config.tpm_limit, now)]
        if config.quota_rpm or config.quota_tpm:
            pair = self._keys.setdefault(key_id(api_key), _Pair())
            scopes.append(pair.filled(config.quota_rpm, config.quota_tpm, now))
        requests = [r for r, _ in scopes if r is not None]
        tokens = [t for _, t in scopes if t is not None]
        return requests, tokens

    def drain(self, config: SimConfig, api_key: str) -> None:
        """Empty `api_key`'s buckets, as a minute or more of use at its limits leaves them: what it
        sends from now on goes at its rate, with no minute's quota to spend at once."""
        requests, tokens = self._buckets(config, api_key)
        for bucket in (*requests, *tokens):
            bucket.level = 0.0

    def levels(self, config: SimConfig, api_key: str) -> dict[str, Level]:
        """Requests and tokens for `api_key`: of each kind, the bucket with the least left (the one that binds)."""
        requests, tokens = self._buckets(config, api_key)
        levels: dict[str, Level] = {}
        for kind, buckets, unlimited in (
            ("requests", requests, UNLIMITED_REQUESTS),
            ("tokens", tokens, UNLIMITED_TOKENS),
        ):
            if not buckets:
                levels[kind] = Level(unlimited, unlimited, 0.0)
            else:
                bucket = min(buckets, key=lambda b: b.level)
                levels[kind] = Level(int(bucket.capacity), max(0, int(bucket.level)), bucket.reset_s())
        return levels

    def headers(self, config: SimConfig, api_key: str) -> dict[str, str]:
        """x-ratelimit-* for `api_key` (`levels`)."""
        headers: dict[str, str] = {}
        for suffix, level in self.levels(config, api_key).items():
            headers[f"x-ratelimit-limit-{suffix}"] = str(level.limit)
            headers[f"x-ratelimit-remaining-{suffix}"] = str(level.remaining)
            headers[f"x-ratelimit-reset-{suffix}"] = fmt_duration(level.reset_s) if level.reset_s > 0 else "0s"
        return headers

    def admit(self, config: SimConfig, api_key: str, tokens: int) -> None:
        """Take one request and `tokens` from every bucket, or raise the 429 saying how long to wait."""
        request_buckets, token_buckets = self._buckets(config, api_key)
        wait_r = max((b.wait_s(1) for b in request_buckets), default=0.0)
        wait_t = max((b.wait_s(tokens) for b in token_buckets), default=0.0)
        if wait_r > 0 or wait_t > 0:
            what = "requests" if wait_r >= wait_t else "tokens"
            binding = max(
                request_buckets if what == "requests" else token_buckets,
                key=lambda b: b.wait_s(1 if what == "requests" else tokens),
            )
            wait = max(wait_r, wait_t)
            asked = 1 if what == "requests" else tokens
            raise ApiError(
                429,
                f"Rate limit reached on {what} per min ({'RPM' if what == 'requests' else 'TPM'}) "
                f"(simulator limit): Limit {int(binding.capacity)}, "
                f"Used {int(binding.capacity - binding.level)}, Requested {asked}. "
                f"Please try again in {fmt_duration(wait)}.",
                type=what,
                code="rate_limit_exceeded",
                headers=retry_headers(wait),
            )
        for bucket in request_buckets:
            bucket.take(1)
        for bucket in token_buckets:
            bucket.take(tokens)
