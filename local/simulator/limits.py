"""The RPM/TPM limiter: continuously refilled token buckets and the x-ratelimit-* headers."""

from __future__ import annotations

from local.simulator.config import SimConfig
from local.simulator.wire import ApiError, retry_headers

# Reported in x-ratelimit-* when no limit is configured: large enough that adaptive
# clients never throttle themselves, and still parseable as integers.
UNLIMITED_REQUESTS = 1_000_000
UNLIMITED_TOKENS = 1_000_000_000


def fmt_duration(seconds: float) -> str:
    """The Go-duration style OpenAI uses in x-ratelimit-reset-*: "20ms", "1.5s", "6m0s"."""
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest}s"


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


class Limiter:
    """The server-wide rpm_limit / tpm_limit buckets; a changed limit starts a full bucket."""

    def __init__(self) -> None:
        self._rpm: Bucket | None = None
        self._tpm: Bucket | None = None

    def reset(self) -> None:
        self._rpm = self._tpm = None

    def _buckets(self, config: SimConfig, now: float) -> tuple[Bucket | None, Bucket | None]:
        if config.rpm_limit and (self._rpm is None or self._rpm.capacity != config.rpm_limit):
            self._rpm = Bucket(config.rpm_limit, now)
        if config.tpm_limit and (self._tpm is None or self._tpm.capacity != config.tpm_limit):
            self._tpm = Bucket(config.tpm_limit, now)
        rpm = self._rpm if config.rpm_limit else None
        tpm = self._tpm if config.tpm_limit else None
        for bucket in (rpm, tpm):
            if bucket is not None:
                bucket.fill(now)
        return rpm, tpm

    def headers(self, config: SimConfig, now: float) -> dict[str, str]:
        rpm, tpm = self._buckets(config, now)
        headers: dict[str, str] = {}
        for suffix, bucket, unlimited in (("requests", rpm, UNLIMITED_REQUESTS), ("tokens", tpm, UNLIMITED_TOKENS)):
            if bucket is None:
                limit, remaining, reset = unlimited, unlimited, "0s"
            else:
                limit, remaining = int(bucket.capacity), max(0, int(bucket.level))
                reset = fmt_duration(bucket.reset_s())
            headers[f"x-ratelimit-limit-{suffix}"] = str(limit)
            headers[f"x-ratelimit-remaining-{suffix}"] = str(remaining)
            headers[f"x-ratelimit-reset-{suffix}"] = reset
        return headers

    def admit(self, config: SimConfig, tokens: int, now: float) -> None:
        """Take one request and `tokens` from the buckets, or raise the 429 saying how long to wait."""
        rpm, tpm = self._buckets(config, now)
        wait_r = rpm.wait_s(1) if rpm else 0.0
        wait_t = tpm.wait_s(tokens) if tpm else 0.0
        if wait_r > 0 or wait_t > 0:
            what = "requests" if wait_r >= wait_t else "tokens"
            raise ApiError(
                429,
                f"Rate limit reached for {what} per minute (simulator limit). Please try again later.",
                type=what,
                code="rate_limit_exceeded",
                headers=retry_headers(max(wait_r, wait_t)),
            )
        if rpm:
            rpm.take(1)
        if tpm:
            tpm.take(tokens)
