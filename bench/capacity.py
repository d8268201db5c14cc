"""Capacity of one Sluice job at 100k, 1M and 10M lines, from the constants the code uses.

Everything Sluice decides is imported, not restated: the environment's settings (cdk.json),
Plan's manifest (built by `sluice.plan.plan_job` itself), the checkpoint size (`PartWriter`),
Merge's part planner (`sluice.merge.plan_parts`), the Lambda sizes (`sluice.contract.STEPS`),
prices (`sluice.costs`), and the history events per loop, counted from the state machine
definition (`infra.definition.definition()`). AWS quotas and prices that the code does not hold
are named constants below, each with its source; assumptions about the input and the provider
are named constants too. Prints the tables that docs/capacity.md embeds:

    .venv/bin/python bench/capacity.py [--env prod] [--rpm 30000] [--latency-s 2.0]
"""

from __future__ import annotations

import argparse
import inspect
import io
import math
import os
import sys
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]
# jsii (under infra's CDK imports) prints a banner on every start under Node 20
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from sluice import costs  # noqa: E402
from sluice.background import BACKGROUND_MAX_WAIT_S  # noqa: E402
from sluice.contract import STEPS, Settings  # noqa: E402
from sluice.merge import MIN_PART, plan_parts  # noqa: E402
from sluice.parts import PART_MAX_AGE_S, PartWriter  # noqa: E402
from sluice.plan import plan_job, plan_lines  # noqa: E402
from sluice.shard import poll_wait_seconds  # noqa: E402

from infra.config import Environment, cdk_json_context  # noqa: E402
from infra.definition import definition  # noqa: E402

SIZES = (100_000, 1_000_000, 10_000_000)

# --- AWS quotas (hard unless said otherwise) -------------------------------------------------
# Step Functions quotas, https://docs.aws.amazon.com/step-functions/latest/dg/service-quotas.html
HISTORY_EVENTS_MAX = 25_000  # events per execution; every Map child is its own execution
PAYLOAD_MAX_BYTES = 256 * 1024  # state input/output, the Map's gathered result included
MAP_CHILDREN_RUNNING_MAX = 10_000  # Distributed Map: child executions running at once
STATE_TRANSITIONS_PER_S = 5_000  # Standard workflows, token bucket size (refill 800-1,500/s by region), soft
# Lambda quotas, https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html
LAMBDA_TIMEOUT_S = 900
LAMBDA_CONCURRENCY = 1_000  # concurrent executions per account and region, default, soft
LAMBDA_FILE_DESCRIPTORS = 1_024
# DynamoDB, https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html
DDB_PARTITION_WCU_PER_S = 1_000  # writes (1 KB) per second on one partition, so on one partition key
DDB_PARTITION_RCU_PER_S = 3_000
# S3, https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html
S3_PREFIX_PUT_PER_S = 3_500  # PUT/COPY/POST/DELETE per second per partitioned prefix
S3_PREFIX_GET_PER_S = 5_500  # GET/HEAD per second per partitioned prefix
S3_MULTIPART_PARTS_MAX = 10_000  # https://docs.aws.amazon.com/AmazonS3/latest/userguide/qfacts.html

# --- Prices (us-east-1 list prices; sluice.costs holds the ones the summary uses) -------------
S3_GET = 0.0000004  # per GET/HEAD, https://aws.amazon.com/s3/pricing/
LAMBDA_REQUEST = 0.0000002  # per invocation, https://aws.amazon.com/lambda/pricing/
# Step Functions bills Standard workflows per state transition (sluice.costs.SFN_TRANSITION);
# DynamoDB on-demand per write request unit (sluice.costs.DDB_WRITE_UNIT).

# --- How many history events each state writes, and how many transitions it bills -------------
# https://docs.aws.amazon.com/step-functions/latest/apireference/API_HistoryEvent.html
# Task: Entered, Scheduled, Started, Succeeded, Exited; a task token adds Submitted.
EVENTS_PER_STATE = {"Task": 5, "TaskToken": 6, "Choice": 2, "Pass": 2, "Wait": 2, "Succeed": 2, "Fail": 1, "Map": 4}
EXECUTION_EVENTS = 2  # ExecutionStarted, ExecutionSucceeded

# --- Assumptions about the work (not AWS's, not the code's) -----------------------------------
INPUT_LINE_BYTES = 400  # one chat request line of the Batch input format
RESULT_LINE_BYTES = 1_000  # one line of the results file (the provider's answer, wrapped)
LATENCY_S = 2.0  # provider latency per request
PROVIDER_RPM = 30_000  # the provider's requests-per-minute limit for the account
PLAN_BYTES_PER_S = 90e6  # one S3 GET stream into a Lambda (bench/README: Plan parses at 282 MB/s)
S3_REQUEST_S = 0.02  # one small S3 request from a Lambda, round trip
MERGE_BYTES_PER_S = 90e6  # bytes Merge downloads and uploads per second (seams between shards)
BACKGROUND_RESPONSE_S = 600.0  # how long a background response takes at the provider


class _Body:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def iter_chunks(self, size: int) -> Iterator[bytes]:
        stream = io.BytesIO(self._data)
        while chunk := stream.read(size):
            yield chunk


class _RecordingS3:
    """Just enough of S3 for `plan_job`: one object in, the manifest it writes kept."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.written: dict[str, bytes] = {}

    def head_object(self, **_: Any) -> dict[str, Any]:
        return {"Metadata": {}, "ContentLength": len(self.data)}

    def get_object(self, **_: Any) -> dict[str, Any]:
        return {"Body": _Body(self.data)}

    def put_object(self, *, Key: str, Body: bytes, **_: Any) -> None:
        self.written[Key] = Body

    def get_paginator(self, _: str) -> Any:
        # Plan lists the response cache's indexes: an empty cache here, as for a first run
        return self

    def paginate(self, **_: Any) -> Any:
        return iter([{"Contents": []}])


class _NoStore:
    def claim_job(self, *_: Any, **__: Any) -> bool:
        return True

    def record_plan(self, *_: Any, **__: Any) -> None:
        return None


def _request(n: int) -> bytes:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 300}]}
    line = {"custom_id": f"request-{n:08d}", "method": "POST", "url": "/v1/chat/completions", "body": body}
    return orjson.dumps(line) + b"\n"


def manifest_item(settings: Settings) -> dict[str, Any]:
    """One manifest entry, as `plan_job` writes it for this environment."""
    data = b"".join(_request(n) for n in range(3))
    s3 = _RecordingS3(data)
    state = plan_job(
        s3=s3,
        store=_NoStore(),  # type: ignore[arg-type]
        settings=settings,
        bucket="sluice-prod-bucket-0123456789ab",
        key="inbox/team/reviews-2026-11.jsonl",
        etag="0123456789abcdef0123456789abcdef",
        execution="arn:aws:states:eu-west-1:123456789012:execution:sluice-prod-0123456789ab:x",
    )
    return dict(orjson.loads(s3.written[state["manifest_key"]])[0])


def manifest_bytes(item: dict[str, Any], lines: int, shard_lines: int) -> int:
    """The manifest of a job of `lines` lines: every entry with its own offsets and numbers."""
    shards = math.ceil(lines / shard_lines)
    total = 2 + shards - 1  # brackets and commas
    for index in range(shards):
        first = index * shard_lines + 1
        count = min(shard_lines, lines - index * shard_lines)
        entry = {
            **item,
            "shard": index,
            "start": (first - 1) * INPUT_LINE_BYTES,
            "end": (first - 1 + count) * INPUT_LINE_BYTES,
            "first_line": first,
            "lines": count,
        }
        total += len(orjson.dumps(entry))
    return total


def plan_memory_per_line(sample: int = 50_000) -> float:
    """Bytes Plan holds per line (the custom_ids it checks for duplicates), measured on `plan_lines`."""
    lines = [_request(n) for n in range(sample)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    result = plan_lines(iter(lines), shard_lines=5000)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert result.requests == sample
    return peak / sample


# --- the state machine ------------------------------------------------------------------------


def _successors(state: dict[str, Any]) -> list[str]:
    found = [state[k] for k in ("Next", "Default") if k in state]
    found += [c["Next"] for c in state.get("Choices", [])]
    found += [c["Next"] for c in state.get("Catch", [])]
    return found


def _events(state: dict[str, Any]) -> int:
    if state["Type"] == "Task" and str(state.get("Resource", "")).endswith(".waitForTaskToken"):
        return EVENTS_PER_STATE["TaskToken"]
    return EVENTS_PER_STATE[state["Type"]]


def shard_states() -> dict[str, dict[str, Any]]:
    (shards,) = [s for s in definition()["States"].values() if s["Type"] == "Map"]
    return dict(shards["ItemProcessor"]["States"])


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


def gathered_result_bytes(shards: int, child_output: int) -> int | None:
    """What the Map gathers from its children into its own output; None when a ResultWriter
    sends it to S3 instead. A child ends with what its last state passes on."""
    (shards_state,) = [s for s in definition()["States"].values() if s["Type"] == "Map"]
    if "ResultWriter" in shards_state:
        return None
    states = shard_states()
    ends = [s for s in states.values() if s["Type"] == "Succeed" or s.get("End")]
    if ends and all("OutputPath" in s and s["OutputPath"] is None for s in ends):
        child_output = 2  # {}
    elif ends and all(s["Type"] == "Pass" and "Result" in s and "ResultPath" not in s for s in ends):
        # the child ends with a fixed result (`true`), not its state
        child_output = max(len(orjson.dumps(s["Result"])) for s in ends)
    return 2 + shards * (child_output + 1)


def wakeups(settings: Settings, seconds: float) -> int:
    """How often a background child wakes while its work runs `seconds`, by the shard's own backoff."""
    elapsed, count = 0.0, 0
    while elapsed < seconds:
        elapsed += poll_wait_seconds(settings, elapsed)
        count += 1
    return count


def child_fixed_events() -> int:
    """A child's events outside its loop: start and end, the cache and mode Choices, the final state."""
    states = shard_states()
    choices = _events(states["Answered from the cache?"]) + _events(states["Which mode?"])
    return EXECUTION_EVENTS + choices + _events(states["Shard finished"])


# --- the tables -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    lines: int
    shards: int
    running: int
    per_shard_concurrency: int
    throughput: float  # requests per second, whole job
    manifest: int
    gathered: int | None
    direct_events: int
    direct_loops: int
    background_wakeups: int
    parts: int
    part_rows: int
    job_pk_wcu_direct: float
    job_pk_wcu_background: float
    s3_put_per_s: float
    merge_parts: int
    merge_copied: int
    merge_bytes_through: int
    merge_s: float
    plan_s: float
    plan_memory_mb: float
    wall_s: float
    cost: dict[str, float]
    shares: dict[str, float]  # of each AWS limit, direct mode
    background_share: float  # of the partition's writes/s, background mode


def job(lines: int, env: Environment, settings: Settings, item: dict[str, Any], plan_per_line: float) -> Job:
    shard_lines = env.shard_lines
    shards = math.ceil(lines / shard_lines)
    running = min(shards, env.map_concurrency)
    per_shard = math.ceil(env.concurrency / running)
    # Little's law: requests in flight / latency, capped by the provider's limit
    throughput = min(running * per_shard / LATENCY_S, PROVIDER_RPM / 60)
    per_shard_rate = throughput / running
    shard_s = shard_lines / per_shard_rate
    run_s = LAMBDA_TIMEOUT_S - env.safety_margin_s
    direct = mode_loops()["direct"]
    background = mode_loops()["background"]
    direct_loops = math.ceil(shard_s / run_s)
    fixed = child_fixed_events()
    direct_events = fixed + direct.events * direct_loops
    background_wakeups = wakeups(settings, BACKGROUND_MAX_WAIT_S)

    every = inspect.signature(PartWriter.__init__).parameters["every"].default
    # a part is cut at `every` outcomes, or once it is PART_MAX_AGE_S old
    part_rows = max(1, min(every, math.floor(per_shard_rate * PART_MAX_AGE_S)))
    parts = math.ceil(lines / part_rows)
    parts_per_s = throughput / part_rows
    # direct: each part updates its shard row and the job row, both under the job's key
    job_pk_direct = 2 * parts_per_s
    # background: each request's row is written when submitted, settled and checkpointed
    job_pk_background = 3 * throughput + job_pk_direct
    s3_put = 2 * parts_per_s

    shard_output = shard_lines * RESULT_LINE_BYTES
    sizes = [shard_output] * (lines // shard_lines)
    if lines % shard_lines:
        sizes.append((lines % shard_lines) * RESULT_LINE_BYTES)
    merge = plan_parts(sizes)
    through = 2 * sum(p.size for p in merge if not p.copy)  # downloaded, then uploaded
    copied = sum(1 for p in merge if p.copy)
    merge_requests = 4 * shards + len(merge) + 4  # per shard: HEAD x2 and stats GETs; the parts
    merge_s = merge_requests * S3_REQUEST_S + through / MERGE_BYTES_PER_S

    plan_s = lines * INPUT_LINE_BYTES / PLAN_BYTES_PER_S
    plan_memory_mb = lines * plan_per_line / 1e6
    wall = plan_s + lines / throughput + merge_s

    requests_wall = lines / throughput
    lambda_gb_s = running * requests_wall * STEPS["run_shard"].memory_mb / 1024 + (plan_s + merge_s) * 1.0
    transitions = 8 + shards * (fixed // 2 + direct.transitions * direct_loops)
    ddb_writes = parts * 2 + shards * 3 + 4
    s3_puts = parts * 2 + shards * 2 + len(merge) + 4
    s3_gets = shards * 6 + len(merge) * 2
    cost = {
        "lambda": lambda_gb_s * costs.LAMBDA_GB_SECOND + (shards * direct_loops + 4) * LAMBDA_REQUEST,
        "step_functions": transitions * costs.SFN_TRANSITION,
        "dynamodb": ddb_writes * costs.DDB_WRITE_UNIT,
        "s3": s3_puts * costs.S3_PUT + s3_gets * S3_GET,
    }

    gathered = gathered_result_bytes(shards, len(orjson.dumps(item)))
    shares = {
        "the Map's gathered result (256 KiB)": (gathered or 0) / PAYLOAD_MAX_BYTES,
        "Plan's memory": plan_memory_mb / STEPS["plan"].memory_mb,
        "Merge's Lambda timeout": merge_s / STEPS["merge"].timeout_s,
        "Plan's Lambda timeout": plan_s / STEPS["plan"].timeout_s,
        "multipart parts (10,000)": len(merge) / S3_MULTIPART_PARTS_MAX,
        "history events per direct child": direct_events / HISTORY_EVENTS_MAX,
        "history events per background child (24 h)": (fixed + background.events * background_wakeups)
        / HISTORY_EVENTS_MAX,
        "writes/s on the job's partition key": job_pk_direct / DDB_PARTITION_WCU_PER_S,
        "S3 PUTs/s per prefix": s3_put / S3_PREFIX_PUT_PER_S,
    }
    return Job(
        lines=lines,
        shards=shards,
        running=running,
        per_shard_concurrency=per_shard,
        throughput=throughput,
        manifest=manifest_bytes(item, lines, shard_lines),
        gathered=gathered,
        direct_events=direct_events,
        direct_loops=direct_loops,
        background_wakeups=background_wakeups,
        parts=parts,
        part_rows=part_rows,
        job_pk_wcu_direct=job_pk_direct,
        job_pk_wcu_background=job_pk_background,
        s3_put_per_s=s3_put,
        merge_parts=len(merge),
        merge_copied=copied,
        merge_bytes_through=through,
        merge_s=merge_s,
        plan_s=plan_s,
        plan_memory_mb=plan_memory_mb,
        wall_s=wall,
        cost=cost,
        shares=shares,
        background_share=job_pk_background / DDB_PARTITION_WCU_PER_S,
    )


def _past(shares: dict[str, float]) -> str:
    past = [f"{name} ({share:.0%})" for name, share in sorted(shares.items(), key=lambda p: -p[1]) if share >= 1]
    if past:
        return "; ".join(past)
    name, share = max(shares.items(), key=lambda pair: pair[1])
    return f"none; nearest: {name} ({share:.0%})"


def _n(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:,.1f}"


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f} MB" if value >= 1e6 else f"{value / 1e3:,.1f} kB"


def _time(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def tables(env: Environment) -> str:
    settings = Settings.from_env(
        {"SLUICE_BUCKET": "b", "SLUICE_TABLE": "t", "SLUICE_API_KEY_SECRET_ARN": "arn", **_settings_env(env)}
    )
    item = manifest_item(settings)
    plan_per_line = plan_memory_per_line()
    jobs = [job(lines, env, settings, item, plan_per_line) for lines in SIZES]
    direct, background = mode_loops()["direct"], mode_loops()["background"]
    out = io.StringIO()

    def row(label: str, *cells: str) -> None:
        out.write(f"| {label} | " + " | ".join(cells) + " |\n")

    out.write(
        f"Environment `{env.name}`: shard_lines {env.shard_lines:,}, map_concurrency {env.map_concurrency}, "
        f"concurrency {env.concurrency:,}, poll_seconds {env.poll_seconds}. Provider: {PROVIDER_RPM:,} RPM, "
        f"{LATENCY_S:g} s a request. Lines of {INPUT_LINE_BYTES} B in, {RESULT_LINE_BYTES:,} B out.\n\n"
    )
    row("lines", *(f"{j.lines:,}" for j in jobs))
    out.write("| --- |" + " ---: |" * len(jobs) + "\n")
    row("shards (Map children)", *(f"{j.shards:,}" for j in jobs))
    row("children running at once", *(f"{j.running:,} of {MAP_CHILDREN_RUNNING_MAX:,}" for j in jobs))
    row("requests in flight per shard", *(f"{j.per_shard_concurrency:,}" for j in jobs))
    row("manifest", *(f"{_mb(j.manifest)}" for j in jobs))
    row(
        "Map's gathered result",
        *("to S3" if j.gathered is None else f"{_mb(j.gathered)} of {_mb(PAYLOAD_MAX_BYTES)}" for j in jobs),
    )
    row("job throughput (requests/s)", *(_n(j.throughput) for j in jobs))
    row(
        "history events per direct child",
        *(f"{j.direct_events} ({j.direct_loops} run{'s' if j.direct_loops > 1 else ''})" for j in jobs),
    )
    row("checkpoint parts (rows each)", *(f"{j.parts:,} ({j.part_rows:,})" for j in jobs))
    row(
        "writes/s on the job's partition key, direct",
        *(f"{_n(j.job_pk_wcu_direct)} of {DDB_PARTITION_WCU_PER_S:,}" for j in jobs),
    )
    row(
        "writes/s on the job's partition key, background",
        *(f"{_n(j.job_pk_wcu_background)} of {DDB_PARTITION_WCU_PER_S:,}" for j in jobs),
    )
    row("S3 PUTs/s under jobs/", *(f"{_n(j.s3_put_per_s)} of {S3_PREFIX_PUT_PER_S:,}" for j in jobs))
    row(
        "merge parts (copied server-side)",
        *(f"{j.merge_parts:,} of {S3_MULTIPART_PARTS_MAX:,} ({j.merge_copied:,})" for j in jobs),
    )
    row("bytes through Merge's Lambda", *(_mb(j.merge_bytes_through) for j in jobs))
    row("Merge time (of 15 min)", *(_time(j.merge_s) for j in jobs))
    row("Plan time (of 15 min)", *(_time(j.plan_s) for j in jobs))
    row(
        "Plan memory for custom_ids",
        *(f"{j.plan_memory_mb:,.0f} MB of {STEPS['plan'].memory_mb:,}" for j in jobs),
    )
    row("wall time", *(_time(j.wall_s) for j in jobs))
    for part in ("lambda", "step_functions", "dynamodb", "s3"):
        row(f"AWS cost: {part.replace('_', ' ')}", *(f"${j.cost[part]:,.4f}" for j in jobs))
    row("AWS cost, total", *(f"${sum(j.cost.values()):,.2f}" for j in jobs))
    row("AWS limits past 100 % (direct)", *(_past(j.shares) for j in jobs))
    row(
        "background mode: writes/s on the job's key",
        *(f"{j.background_share:.0%} of {DDB_PARTITION_WCU_PER_S:,}" for j in jobs),
    )
    out.write("\nWhere each limit binds (direct mode; the share grows with the lines unless marked flat):\n\n")
    out.write("| limit | at 1M lines | binds at about |\n| --- | ---: | ---: |\n")
    first, last = jobs[1], jobs[-1]
    for name in last.shares:
        grows = last.shares[name] > 1.5 * first.shares[name]
        at = f"{last.lines / last.shares[name]:,.0f} lines" if grows and last.shares[name] > 0 else "flat"
        out.write(f"| {name} | {jobs[1].shares[name]:.1%} | {at} |\n")
    fixed = child_fixed_events()
    out.write(
        f"\nHistory events per child, from the definition: {fixed} outside any loop; direct loop "
        f"{' → '.join(direct.states)} = {direct.events} a run; background loop {' → '.join(background.states)} "
        f"= {background.events} a wake-up. A background child polls every {env.poll_seconds} s at first and backs "
        f"off to {settings.batch_poll_max_s} s as its work ages (webhooks end a wait early); it gives up on a "
        f"response after {BACKGROUND_MAX_WAIT_S / 3600:.0f} h, having woken {jobs[0].background_wakeups:,} times: "
        f"{fixed + background.events * jobs[0].background_wakeups:,} events of {HISTORY_EVENTS_MAX:,} "
        f"(a response that takes {BACKGROUND_RESPONSE_S / 60:.0f} min: "
        f"{fixed + background.events * wakeups(settings, BACKGROUND_RESPONSE_S):,} events).\n"
    )
    out.write(f"Merge copies a shard's output server-side only if it is at least {MIN_PART / 2**20:g} MiB.\n")
    return out.getvalue()


def _settings_env(env: Environment) -> dict[str, str]:
    return {
        "SLUICE_SHARD_LINES": str(env.shard_lines),
        "SLUICE_CONCURRENCY": str(env.concurrency),
        "SLUICE_MAP_CONCURRENCY": str(env.map_concurrency),
        "SLUICE_POLL_SECONDS": str(env.poll_seconds),
        "SLUICE_DEFAULT_MODE": env.default_mode,
        "SLUICE_PROVIDER_BASE_URL": env.provider_base_url,
    }


def main(argv: list[str] | None = None) -> None:
    global PROVIDER_RPM, LATENCY_S
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="prod")
    parser.add_argument("--rpm", type=int, default=PROVIDER_RPM)
    parser.add_argument("--latency-s", type=float, default=LATENCY_S)
    args = parser.parse_args(argv)
    PROVIDER_RPM, LATENCY_S = args.rpm, args.latency_s
    env = Environment.from_context(args.env, cdk_json_context()["environments"])
    sys.stdout.write(tables(env))


if __name__ == "__main__":
    main()
