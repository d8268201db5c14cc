"""The fault model: which injected fault a request gets, from (seed, key, attempt) alone.

Hashing (seed, key, attempt) gives three numbers in [0, 1): the first picks the fault by
laying the rates end to end (429, 500, drop, slow, queue wait), the others jitter the
latency and draw outcomes (background results, webhook drops). The outcome never depends on
what other requests arrive in between, and a retried request can succeed.
"""

from __future__ import annotations

import hashlib
import struct

from sluice_local.simulator.config import SimConfig

FAULT_429 = "429"
FAULT_500 = "500"
FAULT_DROP = "drop"
FAULT_SLOW = "slow"
FAULT_QUEUE_WAIT = "queue_wait"
FAULT_RATE_LIMIT = "rate_limit"  # the RPM/TPM limiter, not an injected fault
FAULT_FLEX_UNAVAILABLE = "flex_unavailable"


def draws(seed: int, key: str, attempt: int) -> tuple[float, float, float]:
    """Three independent numbers in [0, 1) for this (seed, key, attempt)."""
    digest = hashlib.blake2b(f"{seed}\x1f{key}\x1f{attempt}".encode(), digest_size=24).digest()
    a, b, c = struct.unpack("<QQQ", digest)
    return a / 2**64, b / 2**64, c / 2**64


def pick_fault(config: SimConfig, u: float) -> str | None:
    edge = 0.0
    for rate, fault in (
        (config.rate_429, FAULT_429),
        (config.rate_500, FAULT_500),
        (config.rate_drop, FAULT_DROP),
        (config.rate_slow, FAULT_SLOW),
        (config.rate_queue_wait, FAULT_QUEUE_WAIT),
    ):
        edge += rate
        if u < edge:
            return fault
    return None


def decide_fault(config: SimConfig, key: str, attempt: int) -> str | None:
    """The injected fault for the `attempt`-th (0-based) request with this key, or None."""
    return pick_fault(config, draws(config.seed, key, attempt)[0])


def flex_unavailable(config: SimConfig, key: str, attempt: int) -> bool:
    """Whether this flex request is answered 429 `resource_unavailable`: a draw of its own, so that
    flex's bad days never shift the other faults of a key."""
    return draws(config.seed, f"flex\x1f{key}", attempt)[0] < config.flex_unavailable_rate


def body_key(path: str, body: bytes) -> str:
    """The fault key of a request that carries no custom id."""
    return f"{path}:{hashlib.blake2b(body, digest_size=8).hexdigest()}"
