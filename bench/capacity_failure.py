"""MarkFailed at scale: a loop of invocations, each bounded by the share of its time the code gives it.

MarkFailed (`sluice.failure`) first marks every shard's row to stop, then assembles the shards
that never finished for at most ASSEMBLY_SHARE of its time, and merges only if it assembled for
less than MERGE_AFTER_SHARE of it; what is left waits for the next invocation, which the
definition's "Every line accounted for?" starts. So no figure of the whole job's failure is one
invocation's: one invocation is held to the Lambda's timeout, the loop to the execution's history.

The worst failure is the latest: every shard in flight has run its whole life and left its parts
unassembled (a shard that finished has its outputs; one not started has no parts), so the parts
to assemble are those of the shards in flight over a shard's life.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.contract import STEPS
from sluice.failure import ASSEMBLY_SHARE, MERGE_AFTER_SHARE

from bench import capacity_definition as definition
from bench import capacity_model as cm


@dataclass(frozen=True)
class FailureLoop:
    """What a failed job of a scenario asks of MarkFailed, at the latest failure."""

    # the stop marks, every invocation
    marks_s: float
    # one shard's assembly at the worst: what an invocation may still be at when its share ends
    one_shard_s: float
    # reading every shard's figures (an invocation past its share still reads those that finished)
    figures_s: float
    # the merge, once every shard is assembled: what Merge's own does
    merge_s: float
    # every assembly
    assembly_s: float
    timeout_s: float

    @property
    def invocations(self) -> int:
        """One, when it assembles everything within the merge's share; else as many as its
        assemblies take at their share, and one more that merges."""
        if self.assembly_s <= MERGE_AFTER_SHARE * self.timeout_s:
            return 1
        return math.ceil(self.assembly_s / (ASSEMBLY_SHARE * self.timeout_s)) + 1

    @property
    def longest_s(self) -> float:
        """The longest invocation: one that assembled for its whole share (and a shard more, begun
        before it ended) and read the rest's figures, or one that assembled for less than the
        merge's share and merged."""
        assembling = min(ASSEMBLY_SHARE * self.timeout_s, self.assembly_s) + self.one_shard_s + self.figures_s
        merging = min(MERGE_AFTER_SHARE * self.timeout_s, self.assembly_s) + self.one_shard_s + self.merge_s
        return self.marks_s + max(assembling, merging)

    @property
    def total_s(self) -> float:
        return self.invocations * (self.marks_s + self.figures_s) + self.assembly_s + self.merge_s

    @property
    def history_events(self) -> int:
        return definition.execution_fixed_events() + self.invocations * definition.failure_loop().events


def worst_features(s: cm.Scenario) -> dict[str, float]:
    """The scenario's features at its latest failure: the runs and shard-seconds of the shards in flight."""
    f = s.features()
    unfinished = min(1.0, s.running / s.shards)
    return {**f, "runs": f["runs"] * unfinished, "shard_seconds": f["shard_seconds"] * unfinished}


def failure_loop(mark_failed: cm.StepModel, merge: cm.StepModel, s: cm.Scenario) -> FailureLoop:
    f = worst_features(s)
    nothing = {name: 0.0 for name in f}
    one = {
        **nothing,
        "lines": float(s.shard_lines),
        "shards": 1.0,
        "runs": f["runs"] / s.running,
        "shard_seconds": f["shard_seconds"] / s.running,
    }
    # the fit's intercept is the job's own (its summary, its event), once
    one_shard_s = cm.step_seconds(mark_failed, one) - cm.step_seconds(mark_failed, nothing)
    marks = {**nothing, "shards": f["shards"]}
    marks_s = cm.call_seconds(mark_failed, marks, "dynamodb UpdateItem")
    merge_s = cm.step_seconds(merge, f) - merge.slice_s
    figures_s = cm.call_seconds(merge, f, "s3 GetObject")
    whole = cm.step_seconds(mark_failed, f)
    return FailureLoop(
        marks_s=marks_s,
        one_shard_s=one_shard_s,
        figures_s=figures_s,
        merge_s=merge_s,
        assembly_s=max(0.0, whole - marks_s - merge_s),
        timeout_s=float(STEPS["mark_failed"].timeout_s),
    )


def failure_figures(mark_failed: cm.StepModel, merge: cm.StepModel, s: cm.Scenario) -> list[cm.Figure]:
    loop = failure_loop(mark_failed, merge, s)
    parts = (
        ("assembling", min(ASSEMBLY_SHARE * loop.timeout_s, loop.assembly_s)),
        ("a shard begun", loop.one_shard_s),
        ("merging", loop.merge_s),
    )
    figures = [
        cm.Figure("mark_failed: an invocation's duration", s.mode, loop.longest_s, loop.timeout_s, "s", parts),
        cm.Figure(
            "execution history events (a failed job)", s.mode, loop.history_events, cm.HISTORY_EVENTS_MAX, "events"
        ),
    ]
    rates = cm.step_figures(mark_failed, s, worst_features(s), seconds=loop.total_s)
    return figures + rates
