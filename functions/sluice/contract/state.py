"""The workflow's state: what each step returns, and a Map child's shard state, read strictly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, fields, replace
from typing import Any, ClassVar, Self, TypeVar

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
    `shards_left` to assemble wait for its next run."""

    KEY: ClassVar[str] = "mark_failed"
    done: bool
    shards_left: int = 0


# where the definition puts MarkFailed's own failure: MarkFailed then records only the job's end
MARK_FAILED_ERROR_KEY = "mark_failed_error"

# the key of a Map child's state that holds its shard (the definition's ItemSelector)
SHARD_KEY = "shard"


@dataclass(frozen=True)
class ShardState:
    """A Map child's state: its shard (a manifest item, as Plan wrote it) and what its steps returned."""

    # the manifest item: the core's ShardSpec, read by the handlers with `strict`
    shard: dict[str, Any]
    run_shard: DirectRun | None = None
    submit: Submitted | None = None
    collect: Collected | None = None
    submit_batch: BatchSubmitted | None = None
    collect_batch: BatchCollected | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardState:
        raw = strict(cls, data, "a shard's state")
        results: dict[str, Any] = {}
        for result in (DirectRun, Submitted, Collected, BatchSubmitted, BatchCollected):
            value = data.get(result.KEY)
            if value is not None:
                results[result.KEY] = result.from_dict(value)
        return replace(raw, **results)
