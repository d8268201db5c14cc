"""What no run here can count, bounded on paper, with the assumption each bound rests on.

Each bound is derived from the code's constants at the maximum scenario, so it moves when they
do; its text says what is assumed. These are what `counts.CONTINGENT` leaves out of the counted
figures: lost races, a shared item learned, a 429's pause, a webhook before its row or after its
line was settled; and what a counted run takes only by timing (a part requeued while the
provider's queue is full) or not at all (the batch queue's reconcile). S3 prefix warm-up needs
none: every counted S3 figure is held to one partition's rate, what a new prefix has before S3
splits it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.limits.batch_queue import QUEUE_SLOTS, RECONCILE_EVERY_S
from sluice.limits.lease import LeasePolicy, lease_period_s
from sluice.shard.frame import OPENINGS_PER_S

from bench.scale.figures import DDB_PARTITION_RCU_PER_S, DDB_PARTITION_WCU_PER_S, HEADROOM
from bench.scale.rates import DDB_CALL_S, Scenario

# a read-change-write of one item: a read and a conditional write, one after the other
WINDOW_S = 2 * DDB_CALL_S
# a requeued part's writes on its shard's partition: its row, its hold and its part's row
REQUEUE_WRITES = 3
# a cut-over batch's collect: its release on one batch-queue slot item (as counted)
CUTOVER_SLOT_WRITES = 1


@dataclass(frozen=True)
class Bound:
    name: str
    value: float
    limit: float
    unit: str
    assumption: str

    @property
    def share(self) -> float:
        return self.value / self.limit

    @property
    def over(self) -> bool:
        return self.share > HEADROOM

    def line(self) -> str:
        verdict = "OVER" if self.over else "ok"
        value = f"{self.value:,.0f}" if self.value >= 10 else f"{self.value:.2g}"
        return (
            f"{verdict:4s} {self.share:6.1%}  {self.name}: {value} of {self.limit:,.0f} {self.unit} "
            f"(bounded on paper)\n         {self.assumption}"
        )


def _looks(policy: LeasePolicy) -> int:
    """The looks a shard makes while another learns the key's rate, for as long as it may take."""
    looks, elapsed, wait = 0, 0.0, policy.learn_poll_s
    while elapsed < policy.learn_wait_max_s:
        looks += 1
        elapsed += wait
        wait = min(policy.learn_poll_max_s, 2 * wait)
    return looks


def bounds(s: Scenario) -> list[Bound]:
    policy = LeasePolicy()
    a = s.active
    lease_s = lease_period_s(policy, a, s.shard_rate)
    leases = a / lease_s
    learners = min(a, OPENINGS_PER_S * policy.learn_wait_max_s)
    looks = _looks(policy)
    return [
        Bound(
            "other leases within one lease's read-change-write of the key's limit item",
            leases * WINDOW_S,
            1.0,
            "(a lost race when 1 or more)",
            f"{a:,.0f} lessees lease every {lease_s:g} s ({leases:,.0f} a second, `item_leases_per_s`), each a read "
            f"and a conditional write about {WINDOW_S * 1000:g} ms apart ({DDB_CALL_S * 1000:g} ms a DynamoDB call "
            "in the region, an assumption): the expected other leases in that window. Under half, most leases "
            "win at once and a lost one (a write billed, a read again after a jittered wait) is the exception",
        ),
        Bound(
            "looks at the key's limit item while the first shard learns its rate",
            learners * looks / policy.learn_wait_max_s,
            DDB_PARTITION_RCU_PER_S,
            "RCU/s",
            f"once a key, while its item is unknown: the opening wave's shards ({OPENINGS_PER_S:g} a second, "
            f"{learners:,.0f} within the {policy.learn_wait_max_s:g} s the learner may take) look {looks} times each "
            f"(from {policy.learn_poll_s:g} s, doubling to {policy.learn_poll_max_s:g} s), 1 RCU a look; with "
            "`rate_limits` seeded (every shipped environment's) no shard waits to learn",
        ),
        Bound(
            "reads of the key's limit item for 429s",
            a / policy.pause_slack_s,
            DDB_PARTITION_RCU_PER_S,
            "RCU/s",
            f"a 429 reads the item only when its reset is over {policy.pause_slack_s:g} s past the pause the shard "
            f"last wrote: each of {a:,.0f} shards at most once a {policy.pause_slack_s:g} s while the key throttles",
        ),
        Bound(
            "writes of the key's limit item for 429s",
            a * WINDOW_S / policy.pause_slack_s * 2,
            DDB_PARTITION_WCU_PER_S,
            "WCU/s",
            "a 429 writes the pause only if the item's is earlier: once a shard has written a reset, the others "
            f"read it and write nothing. Only the shards whose reads fall in the same {WINDOW_S * 1000:g} ms window "
            f"write (one wins, the rest lose, billed): {a:,.0f} x {WINDOW_S:g} s a reset second, twice for the lost "
            "write's retry",
        ),
        Bound(
            "a shard's partition: webhooks after their line was settled",
            s.shard_rate,
            DDB_PARTITION_RCU_PER_S,
            "RCU/s",
            "a repeat delivery (or one the shard's poll settled first) reads the shard's row once, at most once a "
            f"line: {s.shard_rate:.3g} a second at a shard's share of the key; a webhook before its row writes an "
            "EARLY item of its own, spread over the table",
        ),
        Bound(
            "a shard's partition: polls that try again a part the provider's queue had no room for",
            REQUEUE_WRITES / s.poll_s,
            DDB_PARTITION_WCU_PER_S,
            "WCU/s",
            f"counted (`bedrock batch, its queue full`), not compared: how many polls a part waits depends on "
            f"when the provider's queue has room. A waiting shard's poll tries its waiting parts again at most "
            f"once, after the poll's collects, every {s.poll_s:g} s; each try writes the shard's row, its hold "
            f"and its part's row ({REQUEUE_WRITES} WCU, as counted), all on the shard's own partition",
        ),
        Bound(
            "sluice cancel: the account's shard-slots item, a shard's held slot given back",
            1 / DDB_CALL_S,
            DDB_PARTITION_WCU_PER_S,
            "WCU/s",
            "counted (`batch, cancelled`), not compared: what the shards did before the cancel depends on when "
            "it came. Once a job: the job's row, the execution stopped, the outputs written; a shard's calls: its "
            "row marked stopped and read, its outputs read as Merge reads them, each on its own partition once, "
            "and the slot it held given back on the one item all shards share. The give-backs go one shard "
            f"after another, each at least a DynamoDB call ({DDB_CALL_S * 1000:g} ms, an assumption): at most "
            "one write a call on that item, however many shards the job has",
        ),
        Bound(
            "a deadline's cutover: a batch-queue slot item, the late shards' batches collected at once",
            s.in_flight * CUTOVER_SLOT_WRITES / QUEUE_SLOTS,
            DDB_PARTITION_WCU_PER_S,
            "WCU/s",
            "counted (`batch past its deadline's cutover`), not compared: its polls wait on the provider's batch. "
            "Once a late shard: the job has one cutover, and each shard's wait ends at it, so the poll that "
            "cancels the batch (a provider call; Bedrock's StopModelInvocationJob, whose own quota is not "
            "bounded here) and collects it may come for every late shard in the same second, an assumption. "
            f"Each collect releases its hold on one of the key's {QUEUE_SLOTS} batch-queue slot items "
            f"({CUTOVER_SLOT_WRITES} WCU, as counted): the {s.in_flight:,.0f} shards in flight late within a "
            "second; its other writes are on the shard's own partition, and the lines it hands over are sent "
            "as direct lines are",
        ),
        Bound(
            "the key's batch-queue slot a: its reconcile claimed",
            (1 + s.active / s.poll_s * WINDOW_S) / RECONCILE_EVERY_S,
            DDB_PARTITION_WCU_PER_S,
            "WCU/s",
            "counted (`batch, its token queue full`, each run's queue as if never reconciled), not compared: "
            f"due every {RECONCILE_EVERY_S:g} s a key, longer than a run, so how often comes from here. When a "
            f"reservation finds no room, one shard claims the reconcile with a conditional write on slot a, and "
            f"the shards reserving within the same {WINDOW_S * 1000:g} ms read-change-write lose theirs "
            f"({s.active:,.0f} shards, each reserving at most once a {s.poll_s:g} s poll, an assumption); the "
            "winner's listing (Bedrock's ListModelInvocationJobs, a page a hundred batches) is one a key "
            "every reconcile",
        ),
    ]
