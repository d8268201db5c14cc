"""How often each cause occurs at a scenario, from the settings and the periods the code declares.

Nothing here comes from how busy a small run was. A shard's lines go at the key's share that
Plan sized the job's shards to (`rate_capped_shards`: a shard holds MAX_SHARD_CONNECTIONS of the
requests the key keeps in flight over KEY_LATENCY_S, so a shard sends MAX_SHARD_CONNECTIONS /
KEY_LATENCY_S lines a second whatever the key); parts, leases, chunks and stop-mark checks come
at the periods and sizes the code gives them; a waiting shard polls at the environment's
`poll_seconds`. Only what the code synchronises is multiplied: the opening wave (OPENINGS_PER_S
shards a second) and the run ends that inherit it. Causes that happen by chance (lost races, a
shared item made) are not rated here; docs/capacity.md bounds them on paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.cache.lookup import LOOKUP_THREADS
from sluice.contract import STEPS, Settings, causes
from sluice.limits.budget import CHUNK_MAX_REQUESTS
from sluice.limits.flow import MAX_SHARD_CONNECTIONS
from sluice.limits.lease import LeasePolicy, lease_period_s
from sluice.merge.outputs import SHARD_WORKERS as OUTPUT_WORKERS
from sluice.plan.job_options import KEY_LATENCY_S
from sluice.runners.batch.advance import BATCH_WINDOW_S
from sluice.shard.frame import OPENINGS_PER_S
from sluice.store.jobs import PLAN_ROWS_PER_S
from sluice.store.rows import SHARD_PASS_PER_S, SHARD_WORKERS

from infra.config import Environment, cdk_json_context

ENV = "prod"
# a DynamoDB or S3 call's latency from a Lambda in the same region, for the steps that go through
# shards or segments one call per worker at a time (Plan, Merge): the only latencies assumed here
DDB_CALL_S = 0.005
S3_CALL_S = 0.015
# a batch shard collects its part at this many lines a second (reading the provider's output and
# writing parts); batches end when the provider ends them, which no code synchronises, so at most
# the shards whose batches end in the same collect's time collect at once
COLLECT_LINES_PER_S = 5_000.0

LINES = (100_000, 1_000_000, 10_000_000)
IN_FLIGHT = (10, 100, 1_000)
MAXIMUM_LINES, MAXIMUM_IN_FLIGHT, MAXIMUM_CACHE = 10_000_000, 1_000, 100_000_000


def environment(name: str = ENV) -> Environment:
    return Environment.from_context(name, cdk_json_context()["environments"])


def settings_of(env: Environment) -> Settings:
    return Settings.from_env(
        {
            "SLUICE_BUCKET": "b",
            "SLUICE_TABLE": "t",
            "SLUICE_API_KEY_SECRET_ARN": "arn",
            "SLUICE_PROVIDER_BASE_URL": env.provider_base_url,
            "SLUICE_SHARD_LINES": str(env.shard_lines),
            "SLUICE_POLL_SECONDS": str(env.poll_seconds),
            "SLUICE_SAFETY_MARGIN_S": str(env.safety_margin_s),
            "SLUICE_REQUEST_TIMEOUT_S": str(env.request_timeout_s),
        }
    )


@dataclass(frozen=True)
class Scenario:
    mode: str
    lines: int
    in_flight: int
    cached: int
    settings: Settings
    # lines a second the key gives this job (its share of a key other jobs draw on too); None:
    # every running shard at Plan's per-shard cap
    key_share: float | None = None

    @property
    def shards(self) -> int:
        return math.ceil(self.lines / self.settings.shard_lines)

    @property
    def running(self) -> int:
        return min(self.in_flight, self.shards)

    @property
    def shard_rate(self) -> float:
        """Lines a second one running shard settles."""
        if self.mode == "batch":
            return COLLECT_LINES_PER_S
        if self.key_share is not None:
            return self.key_share / self.running
        return MAX_SHARD_CONNECTIONS / KEY_LATENCY_S

    @property
    def line_rate(self) -> float:
        """Lines a second the job settles, all its running shards together."""
        if self.mode == "batch":
            # the shards whose batches end within one collect's time of each other
            collect_s = self.settings.shard_lines / COLLECT_LINES_PER_S
            return COLLECT_LINES_PER_S * max(1.0, self.running * collect_s / BATCH_WINDOW_S)
        return self.running * self.shard_rate

    @property
    def active(self) -> float:
        """Shards settling lines at once: every running one, but in batch mode those collecting."""
        return self.line_rate / self.shard_rate

    @property
    def key_rpm(self) -> float:
        return self.line_rate * 60 if self.mode != "batch" else 0.0

    @property
    def run_s(self) -> float:
        """How long a shard's run lasts before it checkpoints and goes round again."""
        if self.mode != "direct":
            return float(self.settings.poll_seconds)
        return STEPS["run_shard"].timeout_s - self.settings.request_timeout_s - self.settings.safety_margin_s

    @property
    def poll_s(self) -> float:
        return float(self.settings.poll_seconds)

    def label(self) -> str:
        return f"{self.lines:,} lines, {self.in_flight:,} in flight, {self.cached:,} cached"


def scenario(mode: str, lines: int, in_flight: int, cached: int = MAXIMUM_CACHE) -> Scenario:
    return Scenario(mode, lines, in_flight, cached, settings_of(environment()))


def maximum(mode: str) -> Scenario:
    return scenario(mode, MAXIMUM_LINES, MAXIMUM_IN_FLIGHT, MAXIMUM_CACHE)


@dataclass(frozen=True)
class Rate:
    """A cause's occurrences a second: on one shard's items, and on the items every shard shares."""

    shard: float
    job: float
    # how it was derived, for the report
    how: str


def rate(
    cause: causes.Cause, s: Scenario, *, service: str, per_line: int, period_s: float | None, every: int | None
) -> Rate | None:
    """`per_line`: occurrences a line (a whole number: a line's item is written once a state);
    `period_s` and `every`: the shortest period and the `every` the code declared with the cause;
    `service`: whose calls (a step that goes through shards goes at its calls' latency)."""
    per = cause.per
    # lines a second a settling shard goes at, the shards that settle lines, the shards that run
    r, a, n = s.shard_rate, s.active, s.running
    if per is causes.Per.LINE:
        return Rate(r * per_line, s.line_rate * per_line, f"{per_line} a line at {_n(s.line_rate)} lines/s")
    if per is causes.Per.PERIOD:
        assert period_s is not None
        return Rate(1 / period_s, n / period_s, f"every {period_s:g} s a running shard")
    if per is causes.Per.PART:
        assert period_s is not None and every is not None
        one = max(1 / period_s, r / every)
        return Rate(one, one * a, f"every {period_s:g} s or {every} lines a settling shard")
    if per is causes.Per.LEASE:
        assert period_s is not None and every is not None
        # the period the code gives a lease of `a` lessees at a share of `r` a second each
        lasts = lease_period_s(LeasePolicy(), a, r)
        one = min(1 / lasts, r / every)
        return Rate(one, one * a, f"a lease of {lasts:g} s (at least {every} lines) a settling shard")
    if per is causes.Per.CHUNK:
        assert period_s is not None and every is not None
        steady = min(r / every, 1 / period_s)
        # a run's chunks double from `every` requests until one lasts `period_s`: the quick ones
        # come at each run's start, so the opening wave's starts bring them all at once
        quick = math.ceil(math.log2(max(1.0, min(r * period_s / every, CHUNK_MAX_REQUESTS / every)))) + 1
        wave = min(a, OPENINGS_PER_S) * quick
        return Rate(
            steady + quick / s.run_s,
            a * steady + wave,
            f"every {every} lines, doubling to one in {period_s:g} s; {quick} quick ones a run",
        )
    if per is causes.Per.POLL:
        return Rate(1 / s.poll_s, n / s.poll_s, f"every {s.poll_s:g} s a waiting shard")
    if per is causes.Per.RUN:
        steady = n / s.run_s
        # the opening wave starts OPENINGS_PER_S shards a second, and their runs end as they began
        wave = min(float(n), OPENINGS_PER_S)
        return Rate(1 / s.run_s, max(steady, wave), f"a run every {s.run_s:g} s a shard, {wave:g}/s in the wave")
    if per is causes.Per.BATCH:
        wave = min(float(n), OPENINGS_PER_S)
        return Rate(1 / s.run_s, wave, f"once a batch shard, {wave:g}/s in the wave")
    if cause is causes.PLAN_SHARD:
        return Rate(1.0, float(PLAN_ROWS_PER_S), f"{PLAN_ROWS_PER_S} shard rows a second, paced")
    if per is causes.Per.SHARD:
        if service == "dynamodb":
            pace = min(SHARD_WORKERS / DDB_CALL_S, SHARD_PASS_PER_S)
            return Rate(1.0, pace, f"{SHARD_WORKERS} shards at a time, at most {SHARD_PASS_PER_S} a second")
        pace = OUTPUT_WORKERS / S3_CALL_S
        return Rate(1.0, pace, f"{OUTPUT_WORKERS} shards at a time, {S3_CALL_S * 1000:g} ms a call")
    if per is causes.Per.SEGMENT:
        return Rate(1.0, LOOKUP_THREADS / S3_CALL_S, f"{LOOKUP_THREADS} segments at a time, {S3_CALL_S * 1000:g} ms")
    if per is causes.Per.JOB:
        return Rate(1.0, 1.0, "once a job")
    return None


def _n(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"
