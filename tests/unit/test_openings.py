"""A job's first wave of shards opens spread out: the items every shard shares (the key's limit,
the job row's budget) take the first reads and writes of a bounded number of shards a second,
however many run at once."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from sluice.shard.frame import OPENINGS_PER_S, ShardSpec, opening_delay_s

from tests.unit.helpers.cancel import Aws
from tests.unit.helpers.engine import Action, Scripted
from tests.unit.helpers.sweep import aws, run, shard  # noqa: F401  (the fixture)

WINDOW_S = 5.0


def _spec(index: int, running: int) -> ShardSpec:
    return ShardSpec("job", index, "b", "k", "e", 0, 1, index + 1, 1, "direct", 8, 3, running=running)


def test_a_thousand_shards_open_a_hundred_in_any_five_seconds() -> None:
    running = 1_000
    first_wave = [opening_delay_s(_spec(i, running)) for i in range(running)]
    busiest = max(sum(1 for d in first_wave if start <= d < start + WINDOW_S) for start in first_wave)
    assert busiest == OPENINGS_PER_S * WINDOW_S == 100
    assert max(first_wave) < running / OPENINGS_PER_S == 50
    # shards past the first wave start as others end: they do not wait
    assert {opening_delay_s(_spec(i, running)) for i in range(running, 3 * running)} == {0.0}


def test_a_small_job_opens_within_a_fraction_of_a_second() -> None:
    assert max(opening_delay_s(_spec(i, 8)) for i in range(8)) < 0.5


def test_a_shard_of_the_first_wave_sends_nothing_before_its_opening(aws: Aws) -> None:  # noqa: F811
    spec = replace(shard(aws, ["a", "b"]), shard=6, running=8)
    started = time.monotonic()
    first: list[float] = []

    def answer(_cid: str, _n: int) -> Action:
        first.append(time.monotonic())
        return ("ok",)

    out: dict[str, Any] = run(aws, Scripted(default=answer), spec)
    assert out["done"] is True
    assert min(first) - started >= opening_delay_s(spec) == 6 / OPENINGS_PER_S
