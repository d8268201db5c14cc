"""bench/capacity.py reads the definition and the code; its figures follow them."""

from __future__ import annotations

from bench import capacity
from infra.config import Environment, cdk_json_context


def test_every_mode_has_a_loop_counted_from_the_definition() -> None:
    loops = capacity.mode_loops()
    assert set(loops) == {"direct", "background", "batch"}
    states = capacity.shard_states()
    for loop in loops.values():
        assert loop.events == sum(capacity._events(states[s]) for s in loop.states)
        # each state of a loop leads, in the end, back to every other
        assert all(any(n in loop.states for n in capacity._successors(states[s])) for s in loop.states)
    assert "RunShard" in loops["direct"].states and "Collect" not in loops["direct"].states
    assert "AwaitWebhooks" in loops["background"].states


def test_the_tables_cover_the_three_sizes_and_name_what_binds() -> None:
    env = Environment.from_context("dev", cdk_json_context()["environments"])
    text = capacity.tables(env)
    for size in ("100,000", "1,000,000", "10,000,000"):
        assert size in text
    assert "AWS limits past 100 %" in text and "binds at about" in text
    item = capacity.manifest_item(
        capacity.Settings(bucket="b", table="t", provider_base_url="http://x", api_key_secret_arn="a")
    )
    assert {"job_id", "shard", "start", "end", "first_line", "lines", "mode"} <= set(item)
