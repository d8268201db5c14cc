"""Amazon Bedrock batch inference as a `BatchApi`, over boto3's `bedrock` and `s3` clients (passed
in: the function's role signs, there is no key). A part is a JSONL file of `{recordId, modelInput}`
rows (`records`) put in the job bucket under `BEDROCK_INPUT_PREFIX`, and a model invocation job
that reads it with the stack's service role and writes `{jobId}/{file}.out` and
`manifest.json.out` under `BEDROCK_OUTPUT_PREFIX`.

A part's input file is named by its job, shard and part, not its attempt: a part the queue refused
(`QueueFull`) keeps its file, and the next attempt creates its job from it (`staged`) instead of
building and putting up to 1 GB again every few minutes; it goes with the job's files (`clean_up`).
One whose job is never created (its Sluice job failed or was cancelled while it waited, or a
deadline's cutover came first) is left to the bucket's rule that expires `bedrock-batch/`.
A job is found again by its input file and name, which name the shard's tag in full (a job's name is at
most 63 characters: it carries the environment's prefix, then a digest of the job id, enough for
`nameContains`); creating one is idempotent through its `clientRequestToken`, derived from the tag.
Bedrock limits a job to between 100 and 50,000 records, and the jobs that run at once per model: a
part that would exceed that count waits as one a full OpenAI queue refused (`QueueFull`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import Any, Final, TypeVar

import orjson
from botocore.exceptions import ClientError

from sluice.contract.model import Request

from ...contract import BEDROCK_INPUT_PREFIX, BEDROCK_OUTPUT_PREFIX, LOCAL_BEDROCK_JOB_NAME_PREFIX, causes
from ...contract.settings import DEFAULT_BEDROCK_BATCH_JOBS_QUOTA
from ..batch import (
    ENDED,
    BatchApiOpener,
    BatchCounts,
    BatchLimits,
    BatchProblem,
    BatchRow,
    BatchState,
    BatchStatus,
    BatchTag,
    BatchUpload,
    CancelRefused,
    QueueFull,
)
from . import records
from .records import STATES, SUFFIXES, dialect, output_row, unfinished_code

# Bedrock's limits for one job (docs.aws.amazon.com/bedrock/latest/userguide/quotas.html): records,
# and bytes of one input file
MIN_RECORDS: Final = 100
MAX_RECORDS: Final = 50_000
MAX_BYTES: Final = 1024 * 1024 * 1024
# batch inference jobs in progress or submitted at once per base model, the quota's default. Sluice
# holds at most half of it (`held_jobs`): each part takes a hold of one job in the batch queue's
# slots before it is created (`sluice.limits.batch_queue`), so jobs of every shard of every job
# together stay within that half and leave the rest to the account's other users. Bedrock's refusal
# of a create (ServiceQuotaExceededException), which `submit` reports as a full queue, stays the
# backstop for jobs created outside Sluice
MAX_JOBS_PER_MODEL: Final = DEFAULT_BEDROCK_BATCH_JOBS_QUOTA
# the longest a job may wait and run, in hours (Bedrock's default is 24 too)
TIMEOUT_HOURS: Final = 24


def held_jobs(quota: int) -> int:
    """The jobs a model Sluice keeps at Bedrock at once under a quota of `quota`: half, and one
    at least (0: a quota not counted)."""
    return max(1, quota // 2) if quota > 0 else 0


# one job's limits; what limits the jobs at once is their count, not their tokens
LIMITS: Final = BatchLimits(
    max_records=MAX_RECORDS,
    max_bytes=MAX_BYTES,
    min_records=MIN_RECORDS,
    token_queue=False,
    max_jobs=held_jobs(MAX_JOBS_PER_MODEL),
)
_QUOTA_EXCEEDED = "ServiceQuotaExceededException"
_MANIFEST = "manifest.json.out"
# how much of a job's file a read takes at a time
_READ_CHUNK = 1 << 20
_T = TypeVar("_T")


def _digest(job: str) -> str:
    return hashlib.sha256(job.encode()).hexdigest()[:16]


def job_name(prefix: str, tag: BatchTag) -> str:
    """The job's name: the environment's prefix (`bedrock_job_name_prefix`), then its shard's name."""
    return f"{prefix}{_shard_name(tag.job, tag.shard)}{tag.part:03d}-{tag.attempt}"


def _shard_name(job: str, shard: int) -> str:
    # no prefix: the digest alone names the job, whichever prefix a deploy before this one gave it
    return f"{_digest(job)}-{shard:05d}-"


def input_key(tag: BatchTag, endpoint: str) -> str:
    """Where a part's input file goes, the same for every attempt: a listed job names its shard and
    part by it (and its attempt by its name)."""
    return f"{BEDROCK_INPUT_PREFIX}{tag.job}/{tag.shard:05d}-{tag.part:03d}{SUFFIXES[endpoint]}"


def output_prefix(job: str) -> str:
    return f"{BEDROCK_OUTPUT_PREFIX}{job}/"


def _tag(input_uri: str, job_name: str) -> BatchTag | None:
    """The tag a job's input file's S3 URI and its name say; None for a job that is not Sluice's.
    The file names the job, shard and part (an older one its attempt too); the name ends in the attempt."""
    _, _, key = input_uri.removeprefix("s3://").partition("/")
    if not key.startswith(BEDROCK_INPUT_PREFIX):
        return None
    job, _, name = key.removeprefix(BEDROCK_INPUT_PREFIX).rpartition("/")
    numbers = name.split(".", 1)[0].split("-")
    if len(numbers) == 2:
        numbers.append(job_name.rpartition("-")[2])
    if not job or len(numbers) != 3 or not all(n.isdigit() for n in numbers):
        return None
    shard, part, attempt = map(int, numbers)
    return BatchTag(job, shard, part, attempt)


def _s3(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def _time(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value) if isinstance(value, (int, float)) else None


def _input_uri(job: dict[str, Any]) -> str:
    return str(job.get("inputDataConfig", {}).get("s3InputDataConfig", {}).get("s3Uri", ""))


def _output_uri(job: dict[str, Any]) -> str:
    return str(job.get("outputDataConfig", {}).get("s3OutputDataConfig", {}).get("s3Uri", ""))


def _job_id(arn: str) -> str:
    return arn.rsplit("/", 1)[-1]


class BedrockBatchApi:
    """`BatchApi` over boto3's `bedrock` client, with the job bucket through `s3`."""

    def __init__(
        self,
        bedrock: Any,
        s3: Any,
        *,
        bucket: str,
        role_arn: str,
        limits: BatchLimits,
        name_prefix: str = LOCAL_BEDROCK_JOB_NAME_PREFIX,
    ) -> None:
        self._bedrock = bedrock
        self._name_prefix = name_prefix
        self._s3 = s3
        self._bucket = bucket
        self._role_arn = role_arn
        self._limits = limits

    @property
    def limits(self) -> BatchLimits:
        return self._limits

    def encode(self, request: Request) -> bytes:
        return records.record(self.row_ref(request.line, request.custom_id), request)

    def row_ref(self, line: int, custom_id: str) -> str:
        # the user's ids may be anything; a record's id is Bedrock's own 11-character shape
        return f"R{line:010d}"

    async def _call(self, call: Callable[..., _T], **kwargs: Any) -> _T:
        # boto3 blocks: each call runs off the loop that drives the other shards' work
        return await asyncio.to_thread(call, **kwargs)

    @causes.under(causes.BATCH_SUBMIT)
    async def _jobs(self, **filters: Any) -> AsyncIterator[dict[str, Any]]:
        token: str | None = None
        while True:
            page = await self._call(
                self._bedrock.list_model_invocation_jobs,
                maxResults=1000,
                **filters,
                **({"nextToken": token} if token else {}),
            )
            for job in page.get("invocationJobSummaries", []):
                yield job
            token = page.get("nextToken")
            if not token:
                return

    async def find(self, job: str, shard: int, since: float) -> dict[BatchTag, str]:
        found: dict[BatchTag, tuple[float, str]] = {}
        async for summary in self._jobs(nameContains=_shard_name(job, shard), submitTimeAfter=since):
            tag = _tag(_input_uri(summary), str(summary.get("jobName", "")))
            created = _time(summary.get("submitTime")) or 0.0
            if tag is None or (tag.job, tag.shard) != (job, shard) or created < since:
                continue
            if tag not in found or created < found[tag][0]:
                found[tag] = (created, str(summary["jobArn"]))
        return {tag: arn for tag, (_, arn) in found.items()}

    async def listed(self, since: float) -> list[BatchStatus]:
        statuses = []
        async for summary in self._jobs(nameContains=self._name_prefix, submitTimeAfter=since):
            statuses.append(self._status(summary, BatchCounts()))
        return statuses

    @causes.under(causes.BATCH_SUBMIT, causes.REQUEUED)
    async def staged(self, tag: BatchTag, endpoint: str) -> bool:
        try:
            await self._call(self._s3.head_object, Bucket=self._bucket, Key=input_key(tag, endpoint))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise
        return True

    @causes.under(causes.BATCH_SUBMIT)
    async def submit(self, upload: BatchUpload, tag: BatchTag) -> str:
        if not upload.model:
            raise ValueError("a Bedrock batch job runs one model; the part names none")
        key = input_key(tag, upload.endpoint)
        if upload.file is not None:
            upload.file.seek(0)
            await self._call(self._s3.upload_fileobj, Fileobj=upload.file, Bucket=self._bucket, Key=key)
        try:
            created = await self._call(
                self._bedrock.create_model_invocation_job,
                jobName=job_name(self._name_prefix, tag),
                roleArn=self._role_arn,
                # the same tag is the same job: a retry after a lost answer gets the job it created
                clientRequestToken=hashlib.sha256(f"{key}#{tag.attempt}".encode()).hexdigest()[:64],
                modelId=upload.model,
                inputDataConfig={
                    "s3InputDataConfig": {"s3Uri": f"s3://{self._bucket}/{key}", "s3InputFormat": "JSONL"}
                },
                outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{self._bucket}/{output_prefix(tag.job)}"}},
                timeoutDurationInHours=TIMEOUT_HOURS,
                tags=[{"key": "sluice-job", "value": tag.job[:256]}],
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == _QUOTA_EXCEEDED:
                # the file stays staged for the next attempt
                raise QueueFull(str(exc)) from exc
            raise
        return str(created["jobArn"])

    def _status(self, job: dict[str, Any], counts: BatchCounts) -> BatchStatus:
        state = str(job.get("status", ""))
        said = STATES.get(state, "validating")
        input_uri = _input_uri(job)
        output = _output_uri(job)
        message = job.get("message")
        ended = _time(job.get("endTime")) or _time(job.get("lastModifiedTime")) if said in ENDED else None
        return BatchStatus(
            id=str(job["jobArn"]),
            state=said,
            created_at=_time(job.get("submitTime")) or 0.0,
            ended_at=ended,
            # Completed and PartiallyCompleted both ran every record: endTime is when they had
            completed_at=_time(job.get("endTime")) if said == BatchState.COMPLETED else None,
            tag=_tag(input_uri, str(job.get("jobName", ""))),
            counts=counts,
            input_file=input_uri or None,
            output_file=f"{output.rstrip('/')}/{_job_id(str(job['jobArn']))}/" if output else None,
            problems=(BatchProblem(state, str(message)),) if state == "Failed" and message else (),
        )

    async def status(self, batch_id: str) -> BatchStatus:
        job = await self._call(self._bedrock.get_model_invocation_job, jobIdentifier=batch_id)
        status = self._status(job, BatchCounts())
        if status.ended and status.output_file:
            manifest = await self._read(status.output_file + _MANIFEST)
            if manifest:
                status = self._status(job, records.counts(orjson.loads(manifest)))
        return status

    async def _open(self, uri: str) -> Any:
        """The object's body, to read; None when there is no such object."""
        bucket, key = _s3(uri)
        try:
            answer = await self._call(self._s3.get_object, Bucket=bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        return answer["Body"]

    async def _read(self, uri: str) -> bytes | None:
        body = await self._open(uri)
        return None if body is None else bytes(await asyncio.to_thread(body.read))

    async def _lines(self, uri: str) -> AsyncIterator[bytes]:
        """The object's lines as they stream in: a job's files hold up to 50,000 records, and its
        output repeats each record's input beside the answer, hundreds of MB that a step would
        otherwise hold whole, and twice over once split."""
        body = await self._open(uri)
        if body is None:
            return
        rest = b""
        while chunk := await asyncio.to_thread(body.read, _READ_CHUNK):
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                yield line
        if rest:
            yield rest

    @causes.under(causes.BATCH_COLLECT)
    async def rows(self, status: BatchStatus) -> AsyncIterator[BatchRow]:
        if not status.input_file:
            return
        job = await self._call(self._bedrock.get_model_invocation_job, jobIdentifier=status.id)
        path = dialect(status.input_file)
        created = int(status.ended_at or status.created_at)
        answered: set[str] = set()
        if status.output_file:
            name = status.input_file.rsplit("/", 1)[-1]
            async for line in self._lines(status.output_file + name + ".out"):
                try:
                    row = output_row(orjson.loads(line), path, created)
                except (orjson.JSONDecodeError, TypeError, AttributeError):
                    continue
                if row is not None and row.ref not in answered:
                    answered.add(row.ref)
                    yield row
        code = unfinished_code(str(job.get("status", "")))
        if code is None:
            return
        # a record the job left with no row never ran: it goes direct, as an expired batch's does
        async for line in self._lines(status.input_file):
            with contextlib.suppress(orjson.JSONDecodeError, TypeError, AttributeError):
                ref = orjson.loads(line).get("recordId")
                if isinstance(ref, str) and ref not in answered:
                    yield BatchRow(ref, error_code=code, unfinished=True)

    @causes.under(causes.BATCH_SUBMIT, causes.SHARD_FAILED, causes.CANCEL)
    async def cancel(self, batch_id: str) -> BatchStatus:
        try:
            await self._call(self._bedrock.stop_model_invocation_job, jobIdentifier=batch_id)
        except ClientError as exc:
            try:
                now: BatchStatus | None = await self.status(batch_id)
            except ClientError:
                now = None
            raise CancelRefused(str(exc), now) from exc
        return await self.status(batch_id)

    @causes.under(causes.BATCH_COLLECT)
    async def clean_up(self, statuses: Iterable[BatchStatus]) -> None:
        for status in statuses:
            keys = [_s3(status.input_file)] if status.input_file else []
            if status.output_file:
                bucket, prefix = _s3(status.output_file)
                with contextlib.suppress(ClientError):
                    listed = await self._call(self._s3.list_objects_v2, Bucket=bucket, Prefix=prefix)
                    keys += [(bucket, obj["Key"]) for obj in listed.get("Contents", [])]
            for bucket, key in keys:
                with contextlib.suppress(ClientError):
                    await self._call(self._s3.delete_object, Bucket=bucket, Key=key)


def opener(
    bedrock: Callable[[], Any],
    s3: Any,
    *,
    bucket: str,
    role_arn: str,
    limits: BatchLimits | None = None,
    name_prefix: str = LOCAL_BEDROCK_JOB_NAME_PREFIX,
) -> BatchApiOpener:
    """Opens a `BedrockBatchApi` for each run on the `bedrock` client the factory makes (the
    handler's session's, or the local cloud's emulation)."""
    chosen = limits or LIMITS

    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[BedrockBatchApi]:
        yield BedrockBatchApi(bedrock(), s3, bucket=bucket, role_arn=role_arn, limits=chosen, name_prefix=name_prefix)

    return opened
