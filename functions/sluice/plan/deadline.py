"""A job that says when it must finish (`sluice-deadline`, `--deadline`): the deadline read, the
ways a shard may be sent, and what the plan expects of each (a batch's turnaround, flex's slowdown).

Three ways to send a shard, cheapest first where the deadline allows:

- **batch**: the provider's Batch API at half price, within its window (24 h);
- **flex**: OpenAI's flex processing (`service_tier: flex`) where the model has it (`FLEX_MODELS`,
  and those the job adds with `sluice-flex-models`): batch prices, no window, but each request
  slower (`FLEX_SLOWDOWN`), and some lines finding no capacity and going on at the standard tier
  (`FLEX_FALLBACK_SHARE`), so it takes more of the key's time (`flex_key_share`);
- **direct**: list price, at the key's rate.

`sluice.plan.deadline_choice` picks among them, shard by shard. A batch's expected turnaround is
measured from earlier batches of the same family and model when there are some
(`expected_turnaround`), else the family's documented default (`DEFAULT_TURNAROUND_S`), or what the
job says (`sluice-batch-turnaround`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sluice.contract import DEFAULT_PROVIDER, PROVIDERS
from sluice.core.retry import DEFAULT_POLICY
from sluice.providers import flex_models as flex_models_of
from sluice.providers import typical_turnaround_s


class Choice:
    """How one shard of a deadline job is sent."""

    BATCH = "batch"
    FLEX = "flex"
    DIRECT = "direct"


# A batch's expected turnaround (created to ended) where Sluice has measured none of the family's,
# as each family says (`sluice.providers.typical_turnaround_s`). Every one is an expectation for
# the plan, never a promise: the cutover holds the deadline when a batch is slower.
DEFAULT_TURNAROUND_S = {name: typical_turnaround_s(name) for name in PROVIDERS}
# measured turnarounds are read at this quantile: a plan on the median misses half the time
TURNAROUND_QUANTILE = 0.9
# a request's round trip when the key's rate is not known, as `sluice estimate` assumes
DIRECT_LATENCY_S = 2.0
# a flex request takes this many times a direct one's share of the key (slower answers, occasional
# 429 `resource_unavailable` retried): OpenAI gives no figure
FLEX_SLOWDOWN = 2.0
# what the plan keeps in hand of the direct sending time (retries, a slow tail)
SEND_SLACK = 0.05
# the share of a flex shard's lines the plan expects to go on at the standard tier, each after
# `RetryPolicy.tier_fallback_after` answers that flex has no capacity (429 `resource_unavailable`):
# OpenAI gives no figure; a quarter keeps time for a busy day
FLEX_FALLBACK_SHARE = 0.25
# OpenAI's flex processing tier: the models that take `service_tier: flex` (and their snapshots), as
# OpenAI's flex guide lists them; a job adds others with `sluice-flex-models` (`--flex-models`). Each
# family's are its own (`sluice.providers.flex_models`)
FLEX_MODELS = flex_models_of(DEFAULT_PROVIDER)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)([smhd]))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


class DeadlineError(ValueError):
    """A deadline Sluice cannot take: the message names the problem (past, unparseable, no batch)."""


class DeadlineRefused(DeadlineError):
    """Not even every line sent directly at the key's rate finishes by the deadline."""

    def __init__(self, message: str, earliest_finish: float) -> None:
        super().__init__(message)
        self.earliest_finish = earliest_finish


def parse_duration(text: str) -> float | None:
    """Seconds of `6h`, `90m`, `2d`, `1h30m`, `45s`; None when `text` is not one."""
    raw = text.strip().lower()
    if not _DURATION.match(raw):
        return None
    return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(raw))


def parse_deadline(text: str, *, now: float, name: str = "deadline") -> float:
    """The deadline `text` names, as epoch seconds: a duration from `now` (`6h`, `90m`, `2d`,
    `1h30m`) or an ISO-8601 time with its zone (`2025-06-01T09:00:00+02:00`, `...Z`)."""
    raw = text.strip()
    seconds = parse_duration(raw)
    if seconds is not None:
        if seconds <= 0:
            raise DeadlineError(f"{name}={text!r}: a duration must be more than nothing")
        return now + seconds
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise DeadlineError(
            f"{name}={text!r} is neither a duration (6h, 90m, 2d, 1h30m) nor an ISO-8601 time with its zone "
            "(2025-06-01T09:00:00+02:00, or Z for UTC)"
        ) from None
    if when.tzinfo is None:
        raise DeadlineError(
            f"{name}={text!r} has no time zone: add one (+02:00, or Z for UTC), as Sluice's functions run in UTC"
        )
    at = when.timestamp()
    if at <= now:
        ago = human_duration(now - at)
        stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds")
        raise DeadlineError(f"{name}={text!r} is in the past ({ago} before {stamp})")
    return at


def human_duration(seconds: float) -> str:
    """`2 h 05 min`, `3 min 20 s`, `12 s`."""
    seconds = max(0.0, seconds)
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 3600:
        hours, rest = divmod(round(seconds / 60), 60)
        return f"{hours} h {rest:02d} min"
    if seconds >= 60:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest:02d} s"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def has_flex(model: str | None, models: Iterable[str] = FLEX_MODELS) -> bool:
    """Whether OpenAI's flex processing takes `model` (a snapshot of one named in `models` too)."""
    if not model:
        return False
    return any(model == name or model.startswith(name + "-2") for name in models)


def flex_models(extra: str) -> tuple[str, ...]:
    """The models a job says take flex besides `FLEX_MODELS` (`sluice-flex-models`: names separated by
    commas)."""
    return tuple(name.strip() for name in extra.split(",") if name.strip())


def flex_key_share(fallback_after: int = DEFAULT_POLICY.tier_fallback_after) -> float:
    """How many direct requests' worth of the key's time a flex line is planned to take: its slower
    answer, and for `FLEX_FALLBACK_SHARE` of the lines the answers without capacity and the request
    at the standard tier that follow."""
    return FLEX_SLOWDOWN + FLEX_FALLBACK_SHARE * (fallback_after + 1)


class AtLeast(float):
    """A censored turnaround: a batch cancelled or expired after this long had not completed, so its
    turnaround is at least this (a plain float is a completed batch's)."""

    __slots__ = ()


def expected_turnaround(family: str, measured: Sequence[float] = ()) -> tuple[float, str]:
    """A batch's expected turnaround and where the figure comes from: the `TURNAROUND_QUANTILE` of
    earlier batches' (of the same family and model) when Sluice has measured some, else the family's
    documented default.

    Cancelled and expired batches (`AtLeast`) are the slow ones, so dropping them would drift the
    figure short; they count as Kaplan-Meier's censored observations: each keeps its place among
    those still running at its time, and only completions step the estimate. Where so many are
    censored that the estimate never reaches the quantile, all Sluice knows is that it lies past the
    longest figure: it plans on that or the family's default, whichever is longer."""
    default = DEFAULT_TURNAROUND_S.get(family, DEFAULT_TURNAROUND_S["openai"])
    if not measured:
        return default, f"the {family} default ({human_duration(default)}; no earlier batch measured)"
    censored = sum(isinstance(v, AtLeast) for v in measured)
    what = f"{len(measured)} earlier batches" + (f", {censored} of them cancelled or expired" if censored else "")
    at = _kaplan_meier_quantile(measured, TURNAROUND_QUANTILE)
    if at is None:
        longest = max(measured)
        return max(longest, default), (
            f"measured: past the longest of {what} ({human_duration(longest)}), "
            f"so the longer of it and the {family} default"
        )
    return at, f"measured: the {TURNAROUND_QUANTILE:.0%} point of {what}"


def _kaplan_meier_quantile(figures: Sequence[float], quantile: float) -> float | None:
    """The first completion by which the Kaplan-Meier estimate says `quantile` of batches have
    completed; None when the censored ones leave it unknown. At a tie a completion counts first, as
    a batch cancelled at that moment had run at least as long."""
    ordered = sorted(figures, key=lambda v: (float(v), isinstance(v, AtLeast)))
    running = len(ordered)
    surviving = 1.0
    for value in ordered:
        if not isinstance(value, AtLeast):
            surviving *= 1 - 1 / running
            if surviving <= 1 - quantile + 1e-9:
                return float(value)
        running -= 1
    return None


@dataclass(frozen=True)
class JobDeadline:
    """A job's deadline as its options carry it: when (epoch seconds), and the batch turnaround the
    job expects, if it says (seconds; None: measured or the family's default)."""

    at: float
    batch_turnaround_s: float | None = None
    # how long a cancelled batch is given to end and hand back its answers (None: the environment's)
    batch_cancel_s: float | None = None


def read_job_deadline(
    meta: dict[str, str], *, mode: str | None, family: str, has_batch: bool, uploaded_at: float, now: float, prefix: str
) -> JobDeadline | None:
    """The deadline of a job's options (`<prefix>deadline`, `<prefix>batch-turnaround`,
    `<prefix>batch-cancel`), checked: a
    duration counts from the upload (`uploaded_at`), an ISO time must be ahead of `now`; a deadline
    picks the mode of each shard, so it takes no other mode than auto, and needs a Batch API to
    choose."""
    if "deadline" not in meta:
        for option in ("batch-turnaround", "batch-cancel"):
            if option in meta:
                raise DeadlineError(f"{prefix}{option} is read with {prefix}deadline only; set one")
        return None
    raw = meta["deadline"]
    at = parse_deadline(raw, now=uploaded_at, name=f"{prefix}deadline")
    if at <= now:
        raise DeadlineError(f"{prefix}deadline={raw!r} is in the past ({human_duration(now - at)} ago)")
    if "deadline-hours" in meta:
        raise DeadlineError(
            f"{prefix}deadline and {prefix}deadline-hours say the same thing twice; keep {prefix}deadline"
        )
    if mode not in (None, "auto"):
        raise DeadlineError(
            f"{prefix}deadline picks batch, flex or direct for each shard, so it takes no {prefix}mode={mode}; "
            "drop the mode (or set auto)"
        )
    if not has_batch:
        raise DeadlineError(
            f"{prefix}deadline chooses between a batch and direct requests, and the {family} provider has no Batch "
            "API Sluice runs: send the job without a deadline"
        )
    turnaround: float | None = None
    if "batch-turnaround" in meta:
        turnaround = parse_duration(meta["batch-turnaround"])
        if turnaround is None or turnaround <= 0:
            raise DeadlineError(
                f"{prefix}batch-turnaround={meta['batch-turnaround']!r}: expected a duration (30m, 2h, 1h30m)"
            )
    cancel: float | None = None
    if "batch-cancel" in meta:
        cancel = parse_duration(meta["batch-cancel"])
        if cancel is None or cancel <= 0:
            raise DeadlineError(f"{prefix}batch-cancel={meta['batch-cancel']!r}: expected a duration (10m, 90s, 1h)")
    return JobDeadline(at=at, batch_turnaround_s=turnaround, batch_cancel_s=cancel)
