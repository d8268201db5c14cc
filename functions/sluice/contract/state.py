"""The workflow's state, read strictly: what each step returns, the shard a manifest item describes,
and a Map child's state that holds both."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any, ClassVar, Self, TypeVar

from .layout import shard_prefix
from .model import ServiceTier
from .status import DEFAULT_PROVIDER

T = TypeVar("T")


class StateError(ValueError):
    """A step was handed a state it does not know: a typo in the definition or a step, never a default."""


def strict(cls: type[T], data: Mapping[str, Any], what: str) -> T:
    """`cls(**data)`, refusing a key `cls` has no field for and naming a missing one."""
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise StateError(f"{what}: unknown key(s) {', '.join(unknown)}; expected {', '.join(known)}")
    missing = [
        name for name, f in known.items() if name not in data and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise StateError(f"{what}: missing key(s) {', '.join(missing)}")
    return cls(**data)


@dataclass(frozen=True)
class StepResult:
    """What one step returns. The definition keeps it at `$.<KEY>` (its ResultPath), names its
    fields with `path`, and copies exactly these fields out of the Lambda's answer (`selector`)."""

    KEY: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return strict(cls, data, f"{cls.KEY}'s result")

    @classmethod
    def path(cls, name: str) -> str:
        """The JSONPath of one field in the state, for a Choice or a `...Path` field."""
        if name not in {f.name for f in fields(cls)}:
            raise KeyError(f"{cls.__name__} has no field {name!r}")
        return f"$.{cls.KEY}.{name}"

    @classmethod
    def selector(cls) -> dict[str, str]:
        """The ResultSelector that keeps these fields of the Lambda's answer, and nothing else."""
        return {f"{f.name}.$": f"$.Payload.{f.name}" for f in fields(cls)}


@dataclass(frozen=True)
class Planned(StepResult):
    """Plan: the job the Map and Merge work on; `duplicate` when the object already ran."""

    KEY: ClassVar[str] = "plan"
    job_id: str
    bucket: str
    key: str
    etag: str
    manifest_key: str
    output_prefix: str
    map_concurrency: int
    duplicate: bool
    shards: int = 0
    lines: int = 0


@dataclass(frozen=True)
class SlotTaken(StepResult):
    """Take a slot: `taken` once the shard holds one of the environment's shards in flight; else
    wait `wait_seconds` and ask again, `waits` being how often it was refused so far."""

    KEY: ClassVar[str] = "slot"
    taken: bool
    waits: int = 0
    wait_seconds: int = 0


@dataclass(frozen=True)
class DirectRun(StepResult):
    """RunShard: `done` once every line of the shard has its outcome; else it runs again."""

    KEY: ClassVar[str] = "run_shard"
    done: bool
    run: int
    sent: int
    seconds: float = 0.0
    # the job was cancelled or has failed: the shard stopped taking lines
    cancelled: bool = False


@dataclass(frozen=True)
class Submitted(StepResult):
    """Submit: `submitted` once every line is with the provider; then wait `wait_seconds` for webhooks."""

    KEY: ClassVar[str] = "submit"
    submitted: bool
    run: int
    wait_seconds: int
    # when the shard first waited (epoch seconds): how long its responses have had, across runs
    waiting_since: float


@dataclass(frozen=True)
class Collected(StepResult):
    """Collect: `done` once every response settled; else wait `wait_seconds` and collect again."""

    KEY: ClassVar[str] = "collect"
    done: bool
    waiting: int
    wait_seconds: int


@dataclass(frozen=True)
class BatchSubmitted(StepResult):
    """SubmitBatch: the shard's batches exist at the provider; wait `wait_seconds` for them."""

    KEY: ClassVar[str] = "submit_batch"
    batch_ids: list[str]
    batches_created: int
    requests: int
    wait_seconds: int


@dataclass(frozen=True)
class BatchCollected(StepResult):
    """CollectBatch: `done`; or `fallback`, rows the batches did not finish go to RunShard; else wait."""

    KEY: ClassVar[str] = "collect_batch"
    done: bool
    fallback: bool
    waiting: int
    collected: int
    wait_seconds: int


@dataclass(frozen=True)
class Merged(StepResult):
    """Merge: how the job ended and where its outputs are; Notify publishes it as the event's detail."""

    KEY: ClassVar[str] = "merge"
    job_id: str
    bucket: str
    key: str
    status: str
    counts: dict[str, int]
    error_rate: float
    max_error_rate: float
    outputs: dict[str, str]


@dataclass(frozen=True)
class MarkedFailed(StepResult):
    """MarkFailed: `done` once every line is accounted for and the job ended FAILED; else the
    `shards_left` to assemble wait for its next run. `refused` when what failed it is the user's
    (a PlanError): the execution then ends as refused, not failed, and pages nobody."""

    KEY: ClassVar[str] = "mark_failed"
    done: bool
    shards_left: int = 0
    refused: bool = False


# the key of a Map child's state that holds its shard (the definition's ItemSelector)
SHARD_KEY = "shard"


def input_pin(etag: str, version_id: str) -> dict[str, str]:
    """The GetObject arguments that read the very object a job was planned on. A versioned bucket
    keeps it by its VersionId, so a user's overwrite of the key mid-job changes nothing the job
    reads; an unversioned one keeps only the newest, and the ETag refuses (412) any other."""
    return {"VersionId": version_id} if version_id else {"IfMatch": etag}


@dataclass(frozen=True)
class ShardSpec:
    """One shard of a job: a byte range of the input object and how to run it. Plan writes one a
    manifest item (`to_item`), and every step and Merge read it back (`from_dict`)."""

    job_id: str
    shard: int
    bucket: str
    key: str
    etag: str
    start: int
    end: int
    first_line: int
    lines: int
    mode: str
    concurrency: int
    # sends of a line at most; 0: as many as the shard's faults call for (`sluice.shard.sweep`)
    max_attempts: int
    # the shards of the job that run at once (its Map's concurrency, at most its shards)
    running: int = 1
    model: str | None = None
    # the environment's model for a line that names none (`Settings.default_model`)
    default_model: str | None = None
    # this shard's part of the job's rate limits (`sluice-rpm`, `-tpm`), which it never exceeds ...
    rpm: float = 0
    tpm: float = 0
    # ... and the job's whole rate limits, which seed the shared limit when nothing else has
    job_rpm: float = 0
    job_tpm: float = 0
    duplicates_key: str | None = None
    blank: int = 0
    # batch mode: rows a batch did not finish are re-run directly ("direct") or reported ("error")
    on_batch_incomplete: str = "direct"
    # a deadline job's batch shard (`sluice.plan.deadline`): when (epoch seconds) a batch not ended yet is
    # cancelled, its answers kept and the rest sent directly; None: never
    cutover_at: float | None = None
    # ... and its part of the job's whole rate limits and concurrency once past it (0: its `rpm`, `tpm`
    # and `concurrency` as before): the late shards together take what every shard shared
    cutover_share: float = 0.0
    # ... and how long its cancelled batch is given to hand back its answers (0: the environment's
    # `batch_cancel_s`), which sets how soon past the cutover it looks again
    batch_cancel_s: float = 0.0
    # a deadline job's direct shard on OpenAI's flex tier: each request asks for it ("": the default)
    service_tier: ServiceTier = ""
    # a deadline job's choice for the shard (batch, flex or direct), which the summary shows; "": no deadline
    choice: str = ""
    # background mode: when the shard first waited for its responses (epoch seconds); Plan leaves
    # it unset, the handlers take it from Submit's result (`Submitted.waiting_since`)
    waiting_since: float | None = None
    # the job's spending cap in US dollars (0 = none), held across its shards (`sluice.limits.budget`)
    budget_usd: float = 0.0
    # the response cache (`sluice.cache.entries`): Plan already answered the hits; `on`/`write` files answers
    cache: str = "off"
    cache_incomplete: bool = False
    # Plan answered every line from the cache and wrote the shard's outputs: the shard runs nothing
    answered: bool = False
    # the provider family the shard sends to (`Settings.provider`): how its requests and answers read
    provider: str = DEFAULT_PROVIDER
    # per-line output validation (`sluice.formats.validation`): the checks, by name separated by commas
    # ("" = none), how many times an answer is sent in all, and whether a resend repairs
    validate: str = ""
    validate_attempts: int = 1
    validate_repair: bool = False
    # the schema the job names (`sluice-validate-schema`), as JSON; "" = each line's own
    validate_schema: str = ""
    # the input object's version Plan read, in a versioned bucket ("": none, read by `etag`)
    version_id: str = ""

    @property
    def pin(self) -> dict[str, str]:
        """What a read of the input object names to read the object Plan cut (`input_pin`)."""
        return input_pin(self.etag, self.version_id)

    @classmethod
    def path(cls, name: str) -> str:
        """The JSONPath of one field in a Map child's state, for a Choice."""
        if name not in {f.name for f in fields(cls)}:
            raise KeyError(f"{cls.__name__} has no field {name!r}")
        return f"$.{SHARD_KEY}.{name}"

    def to_item(self) -> dict[str, Any]:
        """The manifest item: every field, so that `from_dict` reads it back exactly."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardSpec:
        return strict(cls, data, "the shard")

    @property
    def fills_cache(self) -> bool:
        """The job files its answers in the response cache (`on` or `write`)."""
        return self.cache in ("on", "write")

    @property
    def last_line(self) -> int:
        return self.first_line + self.lines - 1

    @property
    def prefix(self) -> str:
        return shard_prefix(self.job_id, self.shard)

    @property
    def results_key(self) -> str:
        return self.prefix + "results.jsonl"

    @property
    def errors_key(self) -> str:
        return self.prefix + "errors.jsonl"

    @property
    def stats_key(self) -> str:
        return self.prefix + "stats.json"

    @property
    def batch_report_key(self) -> str:
        """What the shard's batches did, for the summary (batch mode only)."""
        return self.prefix + "batch.json"

    @property
    def refusal_key(self) -> str:
        """Why the provider's answers stopped the shard sending, for the summary (`sluice.send.refusal`)."""
        return self.prefix + "refused.json"


# where the definition puts the failure of a step its Catch sends to MarkFailed ...
STEP_ERROR_KEY = "error"
# ... and MarkFailed's own failure: MarkFailed then records only the job's end
MARK_FAILED_ERROR_KEY = "mark_failed_error"

# Plan's payload: the S3 event that started the execution, and the execution's id
PLAN_EVENT_KEY = "event"
PLAN_EXECUTION_KEY = "execution"
# AwaitShard's payload holds the shard (under SHARD_KEY) and the task token that ends its wait
TASK_TOKEN_KEY = "token"


@dataclass(frozen=True)
class ShardState:
    """A Map child's state: its shard (a manifest item, as Plan wrote it) and what its steps returned."""

    shard: ShardSpec
    slot: SlotTaken | None = None
    run_shard: DirectRun | None = None
    submit: Submitted | None = None
    collect: Collected | None = None
    submit_batch: BatchSubmitted | None = None
    collect_batch: BatchCollected | None = None
    # a step's failure after its retries, as the child's Catch gave it: {"Error", "Cause"}
    error: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardState:
        raw = strict(cls, data, "a shard's state")
        results: dict[str, Any] = {SHARD_KEY: ShardSpec.from_dict(data[SHARD_KEY])}
        for result in (SlotTaken, DirectRun, Submitted, Collected, BatchSubmitted, BatchCollected):
            value = data.get(result.KEY)
            if value is not None:
                results[result.KEY] = result.from_dict(value)
        return replace(raw, **results)
