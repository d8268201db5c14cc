"""docs/capacity.md: the method in words, and the tables `bench/capacity.py` prints, as they are."""

from __future__ import annotations

HEAD = """\
# Capacity: what a job asks of AWS, from 100k to 10M lines

This page is generated: `.venv/bin/python bench/capacity.py docs` rewrites it from
`bench/capacity.json`, and `tests/unit/test_capacity.py` fails while it differs. Every figure
comes from measured runs, not from counts typed by hand.

## How the figures are made

1. **The ledger.** The local cloud records every AWS call a job makes (`local/ledger.py`,
   `local/dynamo_meter.py`): the service and operation, the calling step and shard, and what AWS
   counts for it. For DynamoDB that is each item's partition and sort key, its size as DynamoDB
   computes it and the capacity units the request consumes (writes per 1 KB of the larger of the
   item before and after, reads per 4 KB and half that when eventually consistent, a batch item
   by item, a Query by the bytes it read before its filter, a failed conditional write still
   charged, and the writes a global secondary index takes); for S3 the bucket, key, prefix and
   bytes; for every other service the call. Every test runs through it.
2. **The runs.** `bench/capacity.py measure` runs small jobs in the local cloud
   (`bench/capacity_runs.py`), with the simulator's key held to a per-key limit as a provider holds
   one (and drained first, as a key in use for a minute or more is, so no run spends a minute's
   quota at once), and each shard near a line a second, the key's share of a shard at the maximum,
   so that its checkpoints, leases and polls come at the pace they come at scale; only the runs
   whose shards went at most two lines a second give a shard's busiest windows. The runs vary the lines, the
   shards, the shards in flight, how long shards run and how often they loop, and the mode; one runs
   out of its spending cap, and four fail (MarkFailed), with shards of two sizes; the response
   cache grows from run to run. Keys are grouped by their shape (the job's id and every number
   replaced), so the model follows the key layout the code writes, whatever it is; a key written
   from several shards is shared, one written from one shard is that shard's, one per line (an
   item row, a response id) is a line's; a partition key of one shard (`JOB#<job>#<shard>`) holds
   that shard's rows and takes one shard's writes, not the job's.
3. **The model.** `bench/capacity_model.py` fits every count, by non-negative least squares, as
   a·lines + b·shards + r·runs + c·shard-seconds + d, per mode and key. At a scenario the lines
   come at the job's pace, each shard in flight adds what a shard does beyond its lines, and the
   busiest five seconds any one shard had beyond its lines happen in every shard at once (windows
   of runs made to loop every few seconds hold two runs' ends and are left out), but for its
   opening: a shard's calls within a second of its first. A job's first wave opens 20 shards a
   second (`sluice.shard.opening_delay_s`: 1,000 shards over 50 s), so on a key every shard shares,
   the openings of at most 120 shards fall in one five-second window, at the busiest opening any
   shard had, and every other shard is at its busiest window past its opening. Reads the code
   spaces out as more shards make them (the shards waiting for the others' budget pools read the
   job row about 200 times a second together, however many wait) are paced as the code paces them
   at the scenario. An item's size is fitted against the shards in flight, the shards or the lines,
   and its units follow its size. Plan, Merge, Notify and MarkFailed are fitted against the lines,
   shards, shard-seconds and cache (Merge against the lines and shards by mode), and their time on
   AWS is their CPU plus each call at AWS's latency (S3 20 ms, DynamoDB 10 ms) over as many at once
   as the runs saw the step keep in flight, plus their bytes at one stream's 90 MB/s. Merge's
   compaction of the response cache runs in a slice of time the code bounds (60 s), so it counts as
   that slice, not as the cache's backlog. MarkFailed runs as a loop of invocations, each
   assembling for at most 40% of its time: one invocation is held to the timeout, the loop to the
   execution's history. History events, state transitions, Merge's parts and the Map's gathered
   result come from the definition and Merge's planner (`bench/capacity_definition.py`).
4. **The check.** `bench/capacity.py check` prints every figure at the documented maximum
   (10,000,000 lines, 1,000 shards in flight, a 100,000,000-answer cache) above half its limit,
   and exits 1 if there is one. `tests/unit/test_capacity.py` fails when any figure passes half
   its limit that is not on the open list (`OPEN` in `bench/capacity.py`), when an open one grows
   past the share it was measured at, or when an open one is fixed and not taken off the list.

The scenarios: the provider answers in 1 s, a shard keeps 950 requests in flight, the key allows
30,000 requests a minute; the limits are DynamoDB's 1,000 WCU and 3,000 RCU a second on one
partition (so on one item, or one partition key that holds the writes), its 400 KB item, S3's
3,500 PUT and 5,500 GET a second on one prefix, Lambda's concurrent executions (the quota the
environment needs for its shards in flight) and each function's reserved concurrency as the stack
sets it (the shard steps' is the cap on shards in flight: it binds by design), each step's
timeout and memory, Step Functions' 25,000 history events, its API refill rates and state
transitions (outside the three largest regions, where they are lowest).

```sh
.venv/bin/python bench/capacity.py measure      # the runs, 20 minutes or so; rewrites bench/capacity.json
.venv/bin/python bench/capacity.py docs         # rewrites this page from it
.venv/bin/python bench/capacity.py check        # the figures past half their limit at the maximum
```

## The figures

"""


def render(tables: str) -> str:
    return HEAD + tables
