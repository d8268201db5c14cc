"""What the scale check reads from the state machine's definition and Merge's part planner.

History events and state transitions of a Map child are counted from `sluice.contract.definition`
itself: each state's events by its type
(https://docs.aws.amazon.com/step-functions/latest/apireference/API_HistoryEvent.html), the
loop each mode waits in found as a cycle of the child's states. Merge's parts come from
`sluice.merge.merge.plan_parts`, the planner Merge runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sluice.contract.definition import definition
from sluice.merge.merge import plan_parts

# Task: Entered, Scheduled, Started, Succeeded, Exited; a task token adds Submitted.
EVENTS_PER_STATE = {"Task": 5, "TaskToken": 6, "Choice": 2, "Pass": 2, "Wait": 2, "Succeed": 2, "Fail": 1, "Map": 4}
EXECUTION_EVENTS = 2  # ExecutionStarted, ExecutionSucceeded
# https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html: state input and output
PAYLOAD_MAX_BYTES = 256 * 1024
# https://docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html
S3_MULTIPART_PARTS_MAX = 10_000
# one line of the results file at AWS's scale (the provider's answer, wrapped): an assumption
RESULT_LINE_BYTES = 1_000


def _successors(state: dict[str, Any]) -> list[str]:
    found = [state[k] for k in ("Next", "Default") if k in state]
    found += [c["Next"] for c in state.get("Choices", [])]
    found += [c["Next"] for c in state.get("Catch", [])]
    return found


def _events(state: dict[str, Any]) -> int:
    if state["Type"] == "Task" and str(state.get("Resource", "")).endswith(".waitForTaskToken"):
        return EVENTS_PER_STATE["TaskToken"]
    return EVENTS_PER_STATE[state["Type"]]


def _map_state() -> dict[str, Any]:
    (shards,) = [s for s in definition()["States"].values() if s["Type"] == "Map"]
    return dict(shards)


def shard_states() -> dict[str, dict[str, Any]]:
    return dict(_map_state()["ItemProcessor"]["States"])


def loops(states: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The cycles of the child workflow (strongly connected sets of states), each in its order."""
    reach: dict[str, set[str]] = {}
    for name in states:
        seen: set[str] = set()
        todo = list(_successors(states[name]))
        while todo:
            nxt = todo.pop()
            if nxt not in seen and nxt in states:
                seen.add(nxt)
                todo.extend(_successors(states[nxt]))
        reach[name] = seen
    cycles: list[list[str]] = []
    done: set[str] = set()
    for name in states:
        if name in done or name not in reach[name]:
            continue
        members = [other for other in states if other in reach[name] and name in reach[other]]
        done.update(members)
        cycles.append(members)
    return cycles


@dataclass(frozen=True)
class Loop:
    mode: str
    states: list[str]
    events: int

    @property
    def transitions(self) -> int:
        return len(self.states)


def mode_loops() -> dict[str, Loop]:
    """The loop each mode waits in: the cycle that holds its collect or run step."""
    states = shard_states()
    named = {"direct": "RunShard", "background": "Collect", "batch": "CollectBatch"}
    found = {}
    for cycle in loops(states):
        for mode, step in named.items():
            if step in cycle and (mode != "direct" or "Collect" not in cycle):
                found[mode] = Loop(mode, cycle, sum(_events(states[s]) for s in cycle))
    return found


def child_fixed_events() -> int:
    """A child's events outside its loops, at most: its start and end, and every state of the
    child in no cycle once (a child passes some of them, never one twice)."""
    states = shard_states()
    looped = {s for cycle in loops(states) for s in cycle}
    return EXECUTION_EVENTS + sum(_events(state) for name, state in states.items() if name not in looped)


def gathered_result_bytes(shards: int, child_output: int) -> int | None:
    """What the Map gathers from its children into its own output; None when a ResultWriter
    sends it to S3 instead. A child ends with what its last state passes on."""
    shards_state = _map_state()
    if "ResultWriter" in shards_state:
        return None
    ends = [s for s in shard_states().values() if s["Type"] == "Succeed" or s.get("End")]
    if ends and all("OutputPath" in s and s["OutputPath"] is None for s in ends):
        child_output = 2  # {}
    elif ends and all(s["Type"] == "Pass" and "Result" in s and "ResultPath" not in s for s in ends):
        # the child ends with a fixed result (`true`), not its state
        child_output = max(len(orjson.dumps(s["Result"])) for s in ends)
    return 2 + shards * (child_output + 1)


def merge_parts(lines: int, shard_lines: int) -> int:
    """The multipart parts Merge's planner cuts the results file into."""
    sizes = [shard_lines * RESULT_LINE_BYTES] * (lines // shard_lines)
    if lines % shard_lines:
        sizes.append((lines % shard_lines) * RESULT_LINE_BYTES)
    return len(plan_parts(sizes))


def failure_loop() -> Loop:
    """The loop the execution's MarkFailed runs in until every line is accounted for."""
    states = dict(definition()["States"])
    (cycle,) = [c for c in loops(states) if "MarkFailed" in c]
    return Loop("failed", cycle, sum(_events(states[s]) for s in cycle))


def execution_fixed_events() -> int:
    """The execution's events outside its loops, at most: every state in no cycle once."""
    states = dict(definition()["States"])
    looped = {s for cycle in loops(states) for s in cycle}
    return EXECUTION_EVENTS + sum(_events(state) for name, state in states.items() if name not in looped)


def child_fixed_transitions() -> int:
    """A child's state transitions outside its loops, at most: every state of the child in no
    cycle once."""
    states = shard_states()
    looped = {s for cycle in loops(states) for s in cycle}
    return sum(1 for name in states if name not in looped)
