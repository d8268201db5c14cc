"""Small jobs in the local cloud, and the AWS calls of each counted by the cause the code declared.

Each variant (a family, OpenAI, Anthropic or Bedrock, in each of its modes; OpenAI's background
answered by webhook and found by polling; direct under 429s) runs at two sizes that differ in
lines and shards but not in a shard's width or its share of the key.
A run keeps, per cause, how many occurrences the code declared (`sluice.contract.causes`) and, per
cause and per call target (a DynamoDB item or an S3 key, in the shape the code writes it), the
calls and their units. Nothing here is timed: counts per occurrence do not depend on how fast
this machine went, which is what makes the check's figures the same on every run.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import orjson
from boto3.dynamodb.conditions import Attr
from sluice.contract import MARK_FAILED_ERROR_KEY, PARTITION_KEY, SORT_KEY
from sluice.contract.model import Request
from sluice.formats.lines import parse_line
from sluice.limits.batch_queue import QUEUE_SORT_KEY
from sluice.limits.budget import worst_case_nano
from sluice.plan.plan import job_id_for
from sluice.providers import ANTHROPIC, BEDROCK, GEMINI, OPENAI
from sluice.runners.cancel import cancel_job, provider_work_of
from sluice.store.jobs import JobStore

from sluice_local.cloud import REGION, LocalCloud, LocalSettings, run_job
from sluice_local.ledger import Call, Caller, attributed, calling
from sluice_local.simulator import SimConfig, SimulatorServer

# the input's key, as a real upload names it: the job's id (and every key holding it) derives from it
INPUT_KEY = "inbox/team/product-reviews-2026-11-{name}.jsonl"
API_KEY = "sk-capacity"
SHARD_LINES = 30
# a shard's share of the key: lines a second each shard gets, the same at both sizes
SHARD_RPM = 600
# callers that are the harness (uploading, waiting, reading the results), not Sluice
HARNESS = frozenset({"cloud"})
# the state machine's own reads (the distributed Map's ItemReader): one occurrence a job
WORKFLOW_CAUSE = "the workflow's item reader"
UNDECLARED = ""
# the ledger's step for `sluice cancel`, run by the user's credentials
CANCEL_STEP = "cancel"
# every fault a variant may set, off for the others (the simulator is shared by the variants)
FAULTS = (("rate_429", 0.0),)
FAMILIES = {f.name: f for f in (OPENAI, ANTHROPIC, BEDROCK, GEMINI)}


# each family's model in the runs; Bedrock's states no limits in its headers: the configured quota paces it
MODELS = {
    "openai": "gpt-4o-mini",
    "anthropic": "claude-3-5-haiku-latest",
    "bedrock": "anthropic.claude-3-haiku-20240307-v1:0",
    "gemini": "gemini-2.5-flash",
}


@dataclass(frozen=True)
class Variant:
    name: str
    mode: str
    webhooks: bool = True
    family: str = "openai"
    # lines a shard: a Bedrock batch job takes no fewer than 100 records
    width: int = SHARD_LINES
    # the simulator's faults (`SimConfig`), as (name, rate)
    faults: tuple[tuple[str, float], ...] = ()
    # steps that fail for every other shard (half the shards at each size, so that what a failed shard
    # costs its job scales with the shards), as a defect would; MarkFailed: its first call, so its
    # last resort runs
    doomed: tuple[str, ...] = ()
    # the job's own metadata, on top of the run's
    metadata: tuple[tuple[str, str], ...] = ()
    # Bedrock's batch jobs at once a model: 1 fills the queue, so a shard's part waits for room
    jobs_per_model: int | None = None
    # False for a path whose polls depend on timing (a part waiting for the provider's queue): its
    # calls are counted, not compared across sizes, and `paper.py` bounds it
    compared: bool = True
    # the simulator's settings for the run, on top of the runs' (`SIM`), and the local cloud's
    sim: tuple[tuple[str, float | str], ...] = ()
    settings: tuple[tuple[str, Any], ...] = ()
    # `sluice cancel` of the job once every shard has its batch open at the provider
    cancelled: bool = False
    # every shard's batch cut over at the deadline: the summary says each sent lines directly
    cut_over: bool = False
    # the key's batch queue reconciled during the run: its check slot says when
    reconciled: bool = False


VARIANTS = (
    Variant("direct", "direct"),
    Variant("background by webhook", "background"),
    Variant("background by poll", "background", webhooks=False),
    Variant("batch", "batch"),
    Variant("anthropic direct", "direct", family="anthropic"),
    Variant("anthropic batch", "batch", family="anthropic"),
    Variant("bedrock direct", "direct", family="bedrock"),
    Variant("bedrock batch", "batch", family="bedrock", width=100),
    Variant("gemini direct", "direct", family="gemini"),
    Variant("gemini batch", "batch", family="gemini"),
    Variant("direct under 429s", "direct", faults=(("rate_429", 0.3),)),
    # a shard that fails: ShardFailed ends it alone, and Merge the job
    Variant("a failed shard", "direct", doomed=("run_shard",)),
    # a shard whose end fails too: the Map fails, and MarkFailed accounts for the job's lines
    Variant("a failed job", "direct", doomed=("run_shard", "fail_shard")),
    Variant("a failed job's last resort", "direct", doomed=("run_shard", "fail_shard", "mark_failed")),
    # a deadline without the job's turnaround: Plan reads what earlier batches measured
    Variant("direct by a deadline", "direct", metadata=(("sluice-deadline", "10m"), ("sluice-rpm", "6000"))),
    Variant("bedrock batch, its queue full", "batch", family="bedrock", width=100, jobs_per_model=1, compared=False),
    # `sluice cancel` of a batch job whose every batch is open (a phase lasts longer than any run)
    Variant(
        "batch, cancelled",
        "batch",
        sim=(("batch_phase_s", 600.0), ("batch_cancel_s", 0.5)),
        cancelled=True,
        compared=False,
    ),
    # a deadline whose batches are late: each shard's poll past the cutover cancels its batch and
    # sends what it did not answer directly
    Variant(
        "batch past its deadline's cutover",
        "batch",
        metadata=(("sluice-deadline", "20s"), ("sluice-rpm", "6000"), ("sluice-batch-turnaround", "2s")),
        sim=(("batch_phase_s", 10.0), ("batch_cancel_s", 0.5), ("batch_cancel_answers", "none")),
        cut_over=True,
        settings=(("batch_cancel_s", 6.0),),
        compared=False,
    ),
    # the key's batch queue holds one shard's part (a part is about 2,600 tokens): the first part
    # it refuses claims the reconcile, due at once on a queue never reconciled (each run starts so)
    Variant(
        "batch, its token queue full",
        "batch",
        settings=(("batch_queue_tokens", f"{MODELS['openai']}=4000"),),
        reconciled=True,
        compared=False,
    ),
)
# the simulator's settings for every run, unless a variant sets its own
SIM: tuple[tuple[str, float | str], ...] = (
    ("latency_s", 0.02),
    ("batch_phase_s", 0.2),
    ("batch_cancel_s", 0.0),
    ("batch_cancel_answers", "elapsed"),
)
# how long a cancelled run may wait for every shard's batch to be open
OPEN_WAIT_S = 300.0
# shards in flight at each size: a size's shards all run at once
SIZES = (2, 4)


@dataclass
class Target:
    """The calls of one cause to one target shape, and what they touched."""

    calls: int = 0
    read_units: float = 0.0
    write_units: float = 0.0
    # the concrete keys of this shape, to tell a shared item from one a shard or a line has
    keys: set[str] = field(default_factory=set)
    item_bytes: int = 0


@dataclass
class Counted:
    """One run: occurrences per cause, calls per (cause, service, operation, target shape)."""

    variant: str
    lines: int
    shards: int
    compared: bool = True
    occurrences: Counter[str] = field(default_factory=Counter)
    # the periods and `every` the code declared with each cause's occurrences
    periods: dict[str, set[tuple[float | None, int | None]]] = field(default_factory=lambda: defaultdict(set))
    targets: dict[tuple[str, str, str, str], Target] = field(default_factory=lambda: defaultdict(Target))
    # steps whose calls had no cause: (step, service, operation, shape)
    undeclared: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)

    def as_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "lines": self.lines,
            "shards": self.shards,
            "compared": self.compared,
            "occurrences": dict(sorted(self.occurrences.items())),
            "periods": {c: sorted(map(list, p), key=str) for c, p in sorted(self.periods.items())},
            "targets": [
                {
                    "cause": cause,
                    "service": service,
                    "operation": operation,
                    "shape": shape,
                    "calls": t.calls,
                    "read_units": t.read_units,
                    "write_units": t.write_units,
                    "keys": sorted(t.keys),
                    "item_bytes": t.item_bytes,
                }
                for (cause, service, operation, shape), t in sorted(self.targets.items())
            ],
            "undeclared": [[*k, n] for k, n in sorted(self.undeclared.items())],
        }


def shape(text: str, job_id: str) -> str:
    """A key as the code writes it for any job: the job's id as `{job}`, every word with a digit as `{n}`."""
    if job_id:
        text = text.replace(job_id, "{job}")
    text = re.sub(r"[A-Za-z0-9]*\d[A-Za-z0-9]*", "{n}", text)
    # a key's limits, one item a model (a poll, which names none, has its own), and the batch
    # queue's slots, one item a letter picked at random
    text = re.sub(r"LIMIT#\{n\}#[^|#]*", "LIMIT#{n}#{model}", text)
    return re.sub(r"#[a-z]\|QUEUE", "#{slot}|QUEUE", text)


def target_of(call: Call, job_id: str) -> str:
    if call.service == "dynamodb":
        return shape(f"{call.table}:{call.pk}|{call.sk}", job_id) + (f" ({call.index})" if call.index else "")
    if call.service == "s3":
        return shape(call.key, job_id)
    return ""


def request_line(run: str, n: int, mode: str, family: str = "openai") -> bytes:
    """A request of its own (the cache never answers it), of a typical chat or Responses size."""
    text = f"Run {run}, line {n}: summarise this product review in one sentence. " + "The kettle boils fast. " * 8
    model = MODELS[family]
    if mode == "background":
        body: dict[str, Any] = {"model": model, "input": text, "max_output_tokens": 64}
        url = "/v1/responses"
    else:
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 64}
        url = "/v1/chat/completions"
    return orjson.dumps({"custom_id": f"{run}-{n:06d}", "method": "POST", "url": url, "body": body}) + b"\n"


def _worst_case(rows: list[bytes], family: str) -> float:
    total = 0
    for number, raw in enumerate(rows, start=1):
        parsed = parse_line(raw, number)
        assert isinstance(parsed, Request)
        total += worst_case_nano(parsed, FAMILIES[family])
    return total / 1e9


@contextmanager
def local_cloud(sim: SimulatorServer, variant: Variant = VARIANTS[0]) -> Iterator[LocalCloud]:
    # Bedrock's quota for the model, as cdk.json's `rate_limits` gives it: the larger size's share of the key
    quota = {MODELS["bedrock"]: {"rpm": SHARD_RPM * max(SIZES), "tpm": 10_000_000}}
    settings = LocalSettings(
        shard_lines=variant.width,
        map_concurrency=8,
        # a cap that binds no run: every shard takes and gives back its slot, and is counted so
        max_shards_in_flight=8,
        concurrency=64,
        retry_base_delay_s=0.05,
        poll_seconds=1,
        # a batch shard as wide as a direct one: the sizes differ in shards in batch mode too
        batch_max_requests=variant.width,
        provider=variant.family,
        rate_limits=orjson.dumps(quota).decode() if variant.family == "bedrock" else None,
        **dict(variant.settings),
    )
    cloud = LocalCloud(provider_base_url=sim.base_url, api_key=API_KEY, settings=settings)
    with cloud.running():
        yield cloud


def run_one(cloud: LocalCloud, sim: SimulatorServer, variant: Variant, shards: int, workdir: Path) -> Counted:
    lines = shards * variant.width
    name = f"{variant.name.replace(' ', '-')}-{lines}"
    rows = [request_line(name, n, variant.mode, variant.family) for n in range(lines)]
    path = workdir / f"{name}.jsonl"
    path.write_bytes(b"".join(rows))
    metadata = {
        "sluice-mode": variant.mode,
        "sluice-map-concurrency": str(shards),
        "sluice-concurrency": str(8 * shards),
        "sluice-budget-usd": f"{_worst_case(rows, variant.family) * 10:.6f}",
        **dict(variant.metadata),
    }
    if "sluice-deadline" in metadata:
        # a deadline picks each shard's mode itself, and takes none from the job
        del metadata["sluice-mode"]
    sim.configure(
        **{**dict(SIM), **dict(variant.sim)},
        quota_rpm=SHARD_RPM * shards,
        webhook_url=cloud.webhook_url if variant.webhooks else None,
        webhook_secret=cloud.webhook_secret,
        **{**dict(FAULTS), **dict(variant.faults)},
    )
    ledger = cloud.calls
    since = (len(ledger.calls), len(ledger.occurrences))
    cloud.before_invoke = _doom(variant.doomed)
    if variant.jobs_per_model is not None and cloud.bedrock_jobs is not None:
        cloud.bedrock_jobs.jobs_per_model = variant.jobs_per_model
    key = INPUT_KEY.format(name=name)
    started = time.time()
    if variant.reconciled:
        _reconciled(cloud, forget=True)
    if variant.cancelled:
        job_id = _cancelled(cloud, sim, path, key, metadata, shards, lines)
    else:
        run = run_job(cloud, path, key=key, metadata=metadata)
        job_id = run.job_id
        accounted = len(run.results) + len(run.errors) == lines
        # a doomed job ends as it may, but with every line in its results or errors
        expected = (run.status, len(run.results)) == ("SUCCEEDED", lines) or bool(variant.doomed)
        if not (expected and accounted):
            why = run.execution.get("cause") or run.execution.get("error") or ""
            raise RuntimeError(f"{name}: the job ended {run.status} with {len(run.results)} of {lines} answers {why}")
        fallback = [(s.get("batch") or {}).get("direct_fallback_lines", 0) for s in run.summary.get("shards", [])]
        if variant.cut_over and not (len(fallback) == shards and all(fallback)):
            raise RuntimeError(f"{name}: not every shard's batch was cut over: {fallback} lines sent directly")
    if variant.reconciled and _reconciled(cloud) < started:
        raise RuntimeError(f"{name}: the key's batch queue was not reconciled during the run")
    _settle(ledger)
    counted = Counted(variant.name, lines, shards, variant.compared)
    for occurred in ledger.occurrences[since[1] :]:
        # the harness's own reads (a cancelled run's wait for its batches) are not the job's
        if occurred.step in HARNESS:
            continue
        counted.occurrences[occurred.cause] += occurred.count
        counted.periods[occurred.cause].add((occurred.period_s, occurred.every))
    workflow_seen = False
    for call in ledger.calls[since[0] :]:
        # a DynamoDB batch request's every item counts: each is a unit of work on its own item
        if call.step in HARNESS:
            continue
        where = target_of(call, job_id)
        cause = call.cause
        if call.step == "workflow" and not cause:
            cause, workflow_seen = WORKFLOW_CAUSE, True
        if not cause:
            counted.undeclared[(call.step, call.service, call.operation, where)] += 1
            continue
        target = counted.targets[(cause, call.service, call.operation, where)]
        target.calls += 1
        target.read_units += call.read_units
        target.write_units += call.write_units
        target.keys.add(f"{call.table}:{call.pk}|{call.sk}" if call.service == "dynamodb" else call.key)
        target.item_bytes = max(target.item_bytes, call.item_bytes)
    if workflow_seen:
        counted.occurrences[WORKFLOW_CAUSE] += 1
    return counted


def _cancelled(
    cloud: LocalCloud, sim: SimulatorServer, path: Path, key: str, metadata: dict[str, str], shards: int, lines: int
) -> str:
    """Start the job, wait until every shard's batch is open at the provider, and cancel it as
    `sluice cancel` does: a step of its own in the ledger, so its calls count. The wait reads the
    shard rows as the harness, under no cause."""
    key, etag = cloud.upload(path, key=key, metadata=metadata)
    job_id = job_id_for(cloud.bucket, key, etag)
    execution = cloud.start(cloud.object_created_event(key, etag), name=f"{job_id}-{time.time_ns()}")
    store = JobStore(boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name), ttl_days=1)
    deadline = time.monotonic() + OPEN_WAIT_S
    while True:
        # a shard's batch is open once the provider gave it an id (not the placeholder of a part
        # waiting for room) and no collect has ended it
        rows = store.shards(job_id, count=shards, consistent=True)
        if len(provider_work_of(store, job_id, rows, responses_of=set()).batches) == shards:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{job_id}: not every shard's batch was open after {OPEN_WAIT_S:.0f} s: {rows}")
        time.sleep(0.2)
    with calling(Caller(CANCEL_STEP)), attributed():
        report = cancel_job(
            s3=boto3.client("s3", region_name=REGION),
            store=store,
            sfn=boto3.client("stepfunctions", region_name=REGION),
            job_id=job_id,
            provider=lambda: (sim.base_url, API_KEY),
        )
    cloud.wait(execution)
    counts = (report.summary or {}).get("counts") or {}
    if report.status != "CANCELLED" or report.batches_cancelled != shards or report.provider_failures:
        raise RuntimeError(f"{job_id}: the cancel ended {report}")
    if counts.get("results", 0) + counts.get("errors", 0) != lines:
        raise RuntimeError(f"{job_id}: the cancel accounted for {counts} of {lines} lines")
    return job_id


def _reconciled(cloud: LocalCloud, *, forget: bool = False) -> float:
    """When a batch queue of the cloud was last reconciled (0: never), read as the harness;
    `forget`: as if never, so that the run's first refusal reconciles (else not for 300 s)."""
    table = boto3.resource("dynamodb", region_name=REGION).Table(cloud.table_name)
    items = table.scan(FilterExpression=Attr(SORT_KEY).eq(QUEUE_SORT_KEY) & Attr("checked").exists())["Items"]
    for item in items if forget else ():
        table.update_item(
            Key={PARTITION_KEY: item[PARTITION_KEY], SORT_KEY: item[SORT_KEY]}, UpdateExpression="REMOVE checked"
        )
    return 0.0 if forget else max((float(item["checked"]) for item in items), default=0.0)


def _doom(steps: tuple[str, ...]) -> Any:
    """A `before_invoke` that fails each of `steps` for the even shards, and MarkFailed's first call."""
    if not steps:
        return None

    def fail(step: str, payload: dict[str, Any]) -> None:
        shard = (payload.get("shard") or {}).get("shard")
        first_mark = step == "mark_failed" and MARK_FAILED_ERROR_KEY not in payload
        if step in steps and ((shard is not None and shard % 2 == 0) or first_mark):
            raise RuntimeError(f"{step} doomed by the counted run")

    return fail


def _settle(ledger: Any, *, quiet_s: float = 1.0, most_s: float = 120.0) -> None:
    """Wait until no call has come for `quiet_s`: a run's last webhooks and checkpoints land after
    its execution ends, and would count as the next run's."""
    deadline = time.monotonic() + most_s
    seen = -1
    while time.monotonic() < deadline:
        count = len(ledger.calls) + len(ledger.occurrences)
        if count == seen:
            return
        seen = count
        time.sleep(quiet_s)


def count_variant(name: str) -> list[dict[str, Any]]:
    """One variant at both sizes, in a local cloud of its own."""
    [variant] = [v for v in VARIANTS if v.name == name]
    with (
        tempfile.TemporaryDirectory() as tmp,
        SimulatorServer(SimConfig(seed=7)) as sim,
        local_cloud(sim, variant) as cloud,
    ):
        return [run_one(cloud, sim, variant, shards, Path(tmp)).as_json() for shards in SIZES]


def count_all(*, log: Any = None) -> list[Counted]:
    """Every variant at every size, each variant in a local cloud of its own (a fresh limiter
    item and cache), smaller size first."""
    found: list[Counted] = []
    with tempfile.TemporaryDirectory() as tmp, SimulatorServer(SimConfig(seed=7)) as sim:
        for variant in VARIANTS:
            with local_cloud(sim, variant) as cloud:
                for shards in SIZES:
                    counted = run_one(cloud, sim, variant, shards, Path(tmp))
                    found.append(counted)
                    if log is not None:
                        log(f"{variant.name} at {counted.lines} lines: {sum(counted.occurrences.values())} occurrences")
    return found
