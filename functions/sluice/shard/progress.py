"""Live progress from a shard, in the process that runs it.

A deployed job's progress is the counters on its job and shard rows, written with each
checkpoint (a part every 1,000 outcomes or 3 s): exact, and free of extra requests, but
coarse. The local cloud runs every shard in its own process and wants each outcome as it
happens for `sluice run`'s display, so it hands the shards a sink. Reporting to it costs no
AWS request; a shard without one (every deployed Lambda) reports nothing.
"""

from __future__ import annotations

from typing import Protocol

from sluice.contract.model import Outcome


class ProgressSink(Protocol):
    """Called from a shard's event loop, once per line, as soon as the line's fate is known."""

    def outcome(self, outcome: Outcome, *, batch: bool, waited: bool) -> None:
        """A line ended in results or errors. `batch`: the Batch API answered it (half price);
        `waited`: it had been handed to the provider to answer later, and waits no more."""

    def invalid(self, code: str) -> None:
        """An input line went to errors without being sent."""

    def waiting(self, count: int) -> None:
        """Lines handed to the provider to answer later (background responses, batch rows), or
        with a negative count, taken back unanswered (batch rows the shard will send directly)."""

    def cached(self, count: int) -> None:
        """Lines Plan answered from the response cache: results already, never sent."""
