"""A provider's Batch API as the batch runners use it: what they ask of it, and what it answers.

The runners (`sluice.runners.batch.submit`, `batch_advance`, `batch_collect`) cut a shard into input files, keep
the row maps and the queue's accounting, and write outcomes; a `BatchApi` is everything they
need from one provider family: how a request is written as a row of an input file, submitting a
file as a batch (tagged so that it can be found again), finding the batches a lost answer or a
dead run hid, a batch's status, its rows' answers, cancelling it and deleting its files.

The shapes fit the families Sluice runs or will run: OpenAI's Files and Batch APIs (an uploaded
JSONL file, metadata on the batch, output and error files), Anthropic's Message Batches (inline
requests, `custom_id`s of at most 64 of `[a-zA-Z0-9_-]`, hence `row_ref`; results streamed in any
order from one URL), and Amazon Bedrock's batch inference (`{recordId, modelInput}` JSONL in S3,
a minimum and maximum of records per job, `.jsonl.out` files). Their states are read into
OpenAI's words (`BatchState`), which the shard row, the report and the webhooks already use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import orjson

from sluice.contract.model import Request

# provider and Lambda clocks differ: a search for batches an earlier attempt created looks this far
# before that attempt
CLOCK_SLACK_S = 600
# equal jitter (at least half of each step) for the waits around creating a batch: a shard creates
# its batches alone, so there is no crowd to spread out
CREATE_JITTER_FLOOR = 0.5


class BatchState:
    """A batch's state, in OpenAI's words."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


# a batch in one of these has ended: its rows will not change
ENDED = frozenset({BatchState.COMPLETED, BatchState.FAILED, BatchState.EXPIRED, BatchState.CANCELLED})
# a batch in one of these still holds its input tokens in the provider's queue
QUEUED = frozenset({BatchState.VALIDATING, BatchState.IN_PROGRESS, BatchState.FINALIZING, BatchState.CANCELLING})


class QueueFull(Exception):
    """The provider refused to create a batch because its queue is full: try again later."""


class CancelRefused(Exception):
    """The provider did not accept a cancel; `status` is the batch as a look after it showed
    (None when that failed too)."""

    def __init__(self, message: str, status: BatchStatus | None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def ended(self) -> bool:
        """Whether the batch had ended (or was being cancelled) anyway: nothing was left to cancel."""
        return self.status is not None and (self.status.ended or self.status.state == BatchState.CANCELLING)


@dataclass(frozen=True)
class BatchLimits:
    """What one batch may hold, and how long the provider takes at most to run it."""

    max_records: int
    max_bytes: int
    # Bedrock refuses a job of fewer records than this; OpenAI and Anthropic take one
    min_records: int = 1
    completion_window_s: int = 86_400
    # whether the provider's queue is a limit of input tokens enqueued per model, which Sluice keeps
    # under `Settings.batch_queue_limit` (OpenAI's Batch queue limit; Anthropic's processing queue
    # refuses as such a limit would). Bedrock's counts jobs a model and refuses a create past them: a
    # token limit there would only cut its parts small and run them one at a time
    token_queue: bool = True
    # batch jobs of one model Sluice keeps at the provider at once, a hold of one job each in the
    # batch queue's slots (half Bedrock's quota); 0: not counted
    max_jobs: int = 0


@dataclass(frozen=True)
class BatchTag:
    """What a Sluice batch carries to be found again: its shard's part at one attempt (a file the
    provider's full queue refused goes again under the next)."""

    job: str
    shard: int
    part: int
    attempt: int = 1


@dataclass(frozen=True)
class BatchUpload:
    """One input file to submit: rows written by `BatchApi.encode`, one endpoint and model. No
    file: the provider still holds the one an earlier attempt of the part staged (`BatchApi.staged`)."""

    file: IO[bytes] | None
    endpoint: str
    model: str | None
    rows: int
    size: int


def file_of(upload: BatchUpload) -> IO[bytes]:
    """The upload's file, rewound, for a provider that stages none (`staged` is always False)."""
    if upload.file is None:
        raise ValueError("no file to upload: this provider keeps no file staged between attempts")
    upload.file.seek(0)
    return upload.file


def json_record(line: bytes | str) -> dict[str, Any] | None:
    """A line of a batch's results file as its JSON object; None for a blank line, or one that
    is no object."""
    if not line.strip():
        return None
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        # a mangled line answers nothing: its row stays unfinished
        return None
    return record if isinstance(record, dict) else None


@dataclass(frozen=True)
class BatchProblem:
    """An error the provider gave the batch as a whole (it failed validation, or its queue was full):
    `row` is the 1-based row of the input file it names, if it names one."""

    code: str
    message: str
    param: str | None = None
    row: int | None = None


@dataclass(frozen=True)
class BatchCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True)
class BatchStatus:
    """A batch as the provider describes it. `ended_at`: when it ended (the last step it recorded,
    for one that ended naming no end), None while it runs. `completed_at`: when the provider says
    it completed, for a batch that did and only as the provider names it (no stand-in). `files`:
    the provider's references to its input, output and error files, whatever `clean_up` deletes
    and `rows` reads."""

    id: str
    state: str
    created_at: float
    ended_at: float | None = None
    completed_at: float | None = None
    tag: BatchTag | None = None
    counts: BatchCounts = field(default_factory=BatchCounts)
    input_file: str | None = None
    output_file: str | None = None
    error_file: str | None = None
    problems: tuple[BatchProblem, ...] = ()
    # failed because the provider's queue was full: nothing ran, the file goes again later
    queue_full: bool = False

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def queued(self) -> bool:
        return self.state in QUEUED

    @property
    def measured_turnaround_s(self) -> float | None:
        """Created to completed, what a deadline job's plan expects of the next batch; None for a
        batch that ended otherwise: a cancelled, expired or failed batch's end says only that it had
        not completed by then (a censored figure), and one the provider dated only in part says nothing."""
        if self.state != BatchState.COMPLETED or self.completed_at is None or self.created_at <= 0:
            return None
        return max(0.0, self.completed_at - self.created_at)

    @property
    def censored_turnaround_s(self) -> float | None:
        """Created to ended for a batch cancelled or expired before it completed: its turnaround is
        at least this (a censored figure, which the plan counts as such); None for any other end."""
        if self.state not in (BatchState.CANCELLED, BatchState.EXPIRED) or self.ended_at is None:
            return None
        if self.created_at <= 0:
            return None
        return max(0.0, self.ended_at - self.created_at)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(ref for ref in (self.input_file, self.output_file, self.error_file) if ref)


@dataclass(frozen=True)
class BatchRow:
    """One row of a batch's results, named by the `row_ref` it was submitted under: the provider's
    HTTP answer (`status_code`, `body`; `error_code` set when it is not a 2xx), or an error with no
    answer. `unfinished`: the provider never ran the row, and `error_code` says why."""

    ref: str
    status_code: int | None = None
    body: Any = None
    request_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    unfinished: bool = False


class BatchApi(Protocol):
    """One provider family's Batch API, open for one run of a batch step."""

    @property
    def limits(self) -> BatchLimits: ...

    def encode(self, request: Request) -> bytes:
        """`request` as one row of an input file, newline included."""
        ...

    def row_ref(self, line: int, custom_id: str) -> str:
        """The id the provider's answer names the row of input line `line` by."""
        ...

    async def submit(self, upload: BatchUpload, tag: BatchTag) -> str:
        """Create a batch of `upload`, tagged, and return its id; raises `QueueFull` when the
        provider's queue refused it outright (no batch exists then; a file `staged` may)."""
        ...

    async def staged(self, tag: BatchTag, endpoint: str) -> bool:
        """Whether the file an earlier attempt of the tag's part put at the provider is still there,
        for `submit` to create the batch from without an upload (Bedrock's: a part of up to 1 GB in
        S3, which its queue may refuse every few minutes for hours)."""
        ...

    async def find(self, job: str, shard: int, since: float) -> dict[BatchTag, str]:
        """The shard's batches created since `since`, by tag (the older, should a tag have two)."""
        ...

    async def listed(self, since: float) -> list[BatchStatus]:
        """Every batch of the key created since `since`, Sluice's with their tags."""
        ...

    async def status(self, batch_id: str) -> BatchStatus: ...

    def rows(self, status: BatchStatus) -> AsyncIterator[BatchRow]:
        """The answered rows of an ended batch, in the provider's order; rows it cannot read are skipped."""
        ...

    async def cancel(self, batch_id: str) -> BatchStatus:
        """Ask the provider to stop the batch; raises `CancelRefused` when it does not accept."""
        ...

    async def clean_up(self, statuses: Iterable[BatchStatus]) -> None:
        """Delete the batches' files at the provider, best effort: a refusal costs only storage there."""
        ...


# opens the Batch API for one run (a client to close), the way the handler's settings say
BatchApiOpener = Callable[[], AbstractAsyncContextManager[BatchApi]]
