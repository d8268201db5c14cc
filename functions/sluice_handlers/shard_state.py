"""A Map child's state at the handler boundary: typed going in, typed coming out."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sluice.contract import ShardSpec, ShardState


def shard_spec_from_state(event: dict[str, Any]) -> ShardSpec:
    """The shard a child's state holds; an unknown key in either is an error, not a default."""
    state = ShardState.from_dict(event)
    spec = state.shard
    if state.submit is not None:
        # how long the shard's background responses have had, across Submit and Collect runs
        spec = replace(spec, waiting_since=state.submit.waiting_since)
    return spec
