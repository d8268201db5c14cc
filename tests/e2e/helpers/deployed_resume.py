"""What test_deployed_resume.py and the tests beside it share."""

from __future__ import annotations

from typing import Any

from tests.e2e.helpers.cli import Deployed


def run_pipeline(env: Deployed, key: str, **settings: Any) -> dict[str, Any]:
    """What the deployed workflow does for an uploaded object: plan, every shard, merge."""
    state = env.start(key, **settings)
    for spec in env.specs(state):
        env.run_shard(spec)
    return env.merge(state)
