"""Cancel a job: stop its execution and its open work at the provider, and end it CANCELLED.

What had finished stays in the results; every other line goes to the errors with code
`cancelled`, so a cancelled job still accounts for every input line (invariant 1).

A shard Lambda that is running when the execution stops is not interrupted (Step Functions
cannot stop a running Lambda): it finishes its run and checkpoints, but the outputs were
already written, so what it finishes after the cancel is not in them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from botocore.exceptions import ClientError

from sluice.contract import (
    DEFAULT_PROVIDER,
    TERMINAL_STATUSES,
    ExecutionStatus,
    JobStatus,
    Mode,
    Planned,
    Summary,
    causes,
    manifest_key,
)
from sluice.contract.model import ErrorCode, Outcome
from sluice.contract.rows import ShardRow
from sluice.core.retry import RetryPolicy
from sluice.limits.shard_slots import give_back_held
from sluice.merge.merge import merge_job
from sluice.merge.summary import end_job
from sluice.plan.plan import output_prefix
from sluice.providers import apis
from sluice.providers.background import BackgroundApi
from sluice.providers.batch import BatchApiOpener, CancelRefused
from sluice.providers.signing import keyless
from sluice.send.engine import EngineSettings, SessionFactory, fan_out, make_session
from sluice.shard.frame import ShardContext
from sluice.store.jobs import QUEUED_PREFIX, JobStore
from sluice.store.rows import each_shard

# items the provider may still be working on (or holding an answer for) in background mode
OPEN_ITEM_STATUSES = frozenset({"submitted", "settled"})
# a cancel either lands or it doesn't; a long retry budget would only delay the user
CANCEL_POLICY = RetryPolicy(max_attempts=3, request_timeout_s=30.0)


class JobNotFound(LookupError):
    pass


@dataclass(frozen=True)
class ProviderWork:
    batches: list[str] = field(default_factory=list)
    # (line, custom_id, response id)
    responses: list[tuple[int, str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.batches or self.responses)


@dataclass
class CancelReport:
    job_id: str
    status: str
    already_finished: bool = False
    execution_stopped: bool = False
    batches_cancelled: int = 0
    responses_cancelled: int = 0
    # cancels the provider refused because that work had already ended
    already_ended: int = 0
    # "<id>: <why>" for each cancel the provider did not accept
    provider_failures: list[str] = field(default_factory=list)
    # batches and responses not cancelled because the caller asked to skip the provider
    left_open: int = 0
    summary: dict[str, Any] | None = None


def open_provider_work(store: JobStore, job_id: str, *, shards: int | None = None) -> ProviderWork:
    """Batches and background responses of the job that the provider may still be running: every
    shard row, then every shard's item rows, each strongly consistent (an id stored a moment ago
    is work to cancel). `shards` is the job row's count, read when not given."""
    return provider_work_of(store, job_id, store.shards(job_id, count=shards, consistent=True))


def failed_job_work(store: JobStore, job_id: str, rows: list[ShardRow]) -> ProviderWork:
    """What a failed job may still be running at the provider, by its shards' `rows`: their open
    batches, and the open responses of its background shards only (a direct or batch shard has
    none, and its item rows, a row a line, are not read for nothing)."""
    return provider_work_of(
        store, job_id, rows, responses_of={row.shard for row in rows if row.mode == Mode.BACKGROUND}
    )


async def stop_failed_job(
    store: JobStore, state: Planned, context: Callable[[], ShardContext]
) -> tuple[ProviderWork, ProviderCancels]:
    """A failed job's shards told to stop, then its open work at the provider cancelled, so that no
    batch or background response goes on billing for lines nobody will collect; `context` makes a
    step's clients, and is called only when there is work to cancel (it reads the key)."""
    store.stop_shards(state.job_id, JobStatus.FAILED, shards=state.shards)
    rows = store.shards(state.job_id, count=state.shards, consistent=True)
    # the Map's failure stopped its children before they reached their own give-back
    give_back_held(store.table, state.job_id, rows)
    work = failed_job_work(store, state.job_id, rows)
    return work, (await cancel_open_work(context(), work) if work else ProviderCancels())


async def cancel_open_work(ctx: ShardContext, work: ProviderWork) -> ProviderCancels:
    """Cancel `work` at the job's provider, through the clients a shard step has (`ctx`); a cancel
    that cannot even be sent is said in the answer's failures, never raised: what stays open is
    reported, and the caller goes on accounting for the lines."""
    try:
        return await cancel_at_provider(
            work,
            base_url=ctx.settings.provider_base_url,
            api_key=ctx.api_key,
            session_factory=ctx.session_factory,
            batch_api=ctx.batch_api,
            background=ctx.background_api,
            provider=ctx.settings.provider,
            s3=ctx.s3,
        )
    except Exception as exc:
        return ProviderCancels(failures=[f"no cancel sent: {exc!r}"])


def provider_work_of(
    store: JobStore, job_id: str, rows: list[ShardRow], *, responses_of: set[int] | None = None
) -> ProviderWork:
    """The open batches and background responses of the shards whose rows are `rows` (responses
    only of the shards in `responses_of`, when given)."""
    batches: list[str] = []
    for shard in rows:
        # collected batches have a state; the one a webhook said has ended is settled
        ended = set(shard.batch_states or {})
        if shard.batch_settled and shard.provider_id:
            ended.add(shard.provider_id)
        for batch_id in [*(shard.batch_ids or ()), shard.provider_id]:
            if (
                batch_id
                and batch_id not in ended
                and batch_id not in batches
                and not batch_id.startswith(QUEUED_PREFIX)
            ):
                batches.append(str(batch_id))

    def open_items(shard: int) -> list[tuple[int, str, str]]:
        # a shard's item rows, read for its open responses: a cancel's cost grows with the shards
        with causes.because(causes.SHARD_OUTPUTS):
            items = list(store.items(job_id, shard))
        return [
            (item.line, item.custom_id, item.provider_id)
            for item in items
            if item.status in OPEN_ITEM_STATUSES and item.provider_id
        ]

    found = each_shard(open_items, [row.shard for row in rows if responses_of is None or row.shard in responses_of])
    return ProviderWork(batches=batches, responses=[response for shard in found for response in shard])


@dataclass
class ProviderCancels:
    """What the provider said to a job's cancels."""

    batches_cancelled: int = 0
    responses_cancelled: int = 0
    # cancels the provider refused because that work had already ended
    already_ended: int = 0
    # "<id>: <why>" for each cancel the provider did not accept
    failures: list[str] = field(default_factory=list)


async def _cancel_batches(
    batch_ids: list[str], opener: BatchApiOpener, concurrency: int, answers: ProviderCancels
) -> None:
    """Cancel every batch through the provider's Batch API, `concurrency` at a time; its client
    retries 429/5xx as the engine would, and a refusal says whether the batch had ended anyway."""
    gate = asyncio.Semaphore(concurrency)
    async with opener() as api:

        async def cancel(batch_id: str) -> None:
            async with gate:
                try:
                    await api.cancel(batch_id)
                except CancelRefused as refused:
                    if refused.ended:
                        answers.already_ended += 1
                    else:
                        answers.failures.append(f"{batch_id}: {refused}")
                else:
                    answers.batches_cancelled += 1

        await asyncio.gather(*(cancel(batch_id) for batch_id in batch_ids))


async def _cancel_responses(
    responses: list[tuple[int, str, str]],
    background: BackgroundApi,
    *,
    base_url: str,
    api_key: str,
    concurrency: int,
    session_factory: SessionFactory,
    answers: ProviderCancels,
) -> None:
    """POST a cancel for every response with the engine's retries on 429/5xx; each refused one is
    followed by a poll, so a response that simply ended before the cancel is no failure."""
    settings = EngineSettings(
        concurrency=concurrency,
        policy=CANCEL_POLICY,
        user_agent="sluice-cancel/0.1",
        base_url=base_url,
        api_key=api_key,
    )
    ids = {line: response_id for line, _custom_id, response_id in responses}
    cancels: list[Outcome] = []
    checks: list[Outcome] = []
    async with session_factory(concurrency) as session:
        await fan_out(
            (background.cancel_request(line, response_id, response_id) for line, response_id in ids.items()),
            session=session,
            settings=settings,
            sink=cancels.append,
        )
        refused = {o.line for o in cancels if not o.ok}
        lookups = (background.poll_request(line, ids[line], ids[line]) for line in ids if line in refused)
        await fan_out(lookups, session=session, settings=settings, sink=checks.append)
    ended = {check.line for check in checks if check.ok and background.ended(check.body)}
    for outcome in cancels:
        if outcome.ok:
            answers.responses_cancelled += 1
        elif outcome.line in ended:
            answers.already_ended += 1
        else:
            answers.failures.append(f"{outcome.custom_id}: {outcome.error_message}")


async def cancel_at_provider(
    work: ProviderWork,
    *,
    base_url: str,
    api_key: str,
    concurrency: int = 32,
    session_factory: SessionFactory = make_session,
    batch_api: BatchApiOpener | None = None,
    background: BackgroundApi | None = None,
    provider: str = DEFAULT_PROVIDER,
    s3: Any = None,
    bedrock: Callable[[], Any] | None = None,
) -> ProviderCancels:
    """Cancel every open batch (through the provider's Batch API) and background response at the
    provider at `base_url`; `batch_api` and `background` default to those of its family, `provider`
    (Bedrock's batch jobs through the caller's `bedrock` clients and `s3`)."""
    answers = ProviderCancels()
    opener = batch_api or apis.batch_api_to_cancel(
        provider,
        base_url,
        api_key,
        timeout_s=CANCEL_POLICY.request_timeout_s,
        max_retries=CANCEL_POLICY.max_attempts - 1,
        s3=s3,
        bedrock=bedrock,
    )
    jobs = []
    if work.batches:
        jobs.append(_cancel_batches(work.batches, opener, concurrency, answers))
    if work.responses:
        jobs.append(
            _cancel_responses(
                work.responses,
                background or apis.background_api(provider),
                base_url=base_url,
                api_key=api_key,
                concurrency=concurrency,
                session_factory=session_factory,
                answers=answers,
            )
        )
    await asyncio.gather(*jobs)
    return answers


def planned_provider(s3: Any, bucket: str, job_id: str) -> str:
    """The provider family Plan gave the job's shards: the job's open work is that family's."""
    try:
        raw = s3.get_object(Bucket=bucket, Key=manifest_key(job_id))["Body"].read()
    except ClientError:
        return DEFAULT_PROVIDER
    items = orjson.loads(raw)
    provider = items[0].get("provider") if isinstance(items, list) and items and isinstance(items[0], dict) else None
    return provider if isinstance(provider, str) and provider else DEFAULT_PROVIDER


def _stop_execution(sfn: Any, execution_arn: str | None, reason: str) -> bool:
    if not execution_arn:
        return False
    try:
        if sfn.describe_execution(executionArn=execution_arn)["status"] != ExecutionStatus.RUNNING:
            return False
        sfn.stop_execution(executionArn=execution_arn, error="Sluice.Cancelled", cause=reason)
    except ClientError as exc:
        if exc.response["Error"]["Code"] == "ExecutionDoesNotExist":
            return False
        raise
    return True


def _manifest_exists(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def _cancel_provider_work(
    report: CancelReport,
    work: ProviderWork,
    *,
    base_url: str,
    api_key: str,
    concurrency: int,
    session_factory: SessionFactory,
    provider: str,
    s3: Any,
    bedrock: Callable[[], Any] | None,
) -> None:
    """Cancel the job's open batches and responses at the provider, and count in `report` what
    was cancelled, what had already ended, and what the provider refused."""
    answers = asyncio.run(
        cancel_at_provider(
            work,
            base_url=base_url,
            api_key=api_key,
            concurrency=concurrency,
            session_factory=session_factory,
            provider=provider,
            s3=s3,
            bedrock=bedrock,
        )
    )
    report.batches_cancelled = answers.batches_cancelled
    report.responses_cancelled = answers.responses_cancelled
    report.already_ended = answers.already_ended
    report.provider_failures = answers.failures


@causes.caused(causes.CANCEL)
def cancel_job(
    *,
    s3: Any,
    store: JobStore,
    sfn: Any,
    job_id: str,
    provider: Callable[[], tuple[str, str]],
    reason: str = "cancelled by the user",
    concurrency: int = 32,
    session_factory: SessionFactory = make_session,
    provider_cancels: bool = True,
    bedrock: Callable[[], Any] | None = None,
) -> CancelReport:
    """Cancel one job. `provider()` returns (base_url, api_key); it is called only when the
    provider has open work and sends a key, so a direct-mode job, or one on a family that signs
    its requests (Bedrock, whose jobs are stopped through the caller's `bedrock` clients), cancels
    without reading the secret.
    `provider_cancels=False` leaves that work open and only ends the job with what finished
    (a user who will not wait for the provider)."""
    job = store.job(job_id)
    if job is None:
        raise JobNotFound(job_id)
    if job.status in TERMINAL_STATUSES:
        kept = job.summary.to_json() if job.summary else None
        return CancelReport(job_id, job.status, already_finished=True, summary=kept)

    # stop first: once the execution is stopped no new shard run starts and sends more, and once
    # the shard rows are marked the runs still going stop within one poll period
    report = CancelReport(job_id, JobStatus.CANCELLED, execution_stopped=_stop_execution(sfn, job.execution, reason))
    shards = job.shards or 0
    store.stop_shards(job_id, JobStatus.CANCELLED, shards=shards)

    rows = store.shards(job_id, count=shards, consistent=True)
    # the stopped execution's children never reach their own give-back
    give_back_held(store.table, job_id, rows)
    work = provider_work_of(store, job_id, rows)
    if work and not provider_cancels:
        report.left_open = len(work.batches) + len(work.responses)
    elif work:
        family = planned_provider(s3, job.bucket, job_id)
        base_url, api_key = ("", "") if keyless(family) else provider()
        _cancel_provider_work(
            report,
            work,
            base_url=base_url,
            api_key=api_key,
            concurrency=concurrency,
            session_factory=session_factory,
            provider=family,
            s3=s3,
            bedrock=bedrock,
        )

    bucket, key = job.bucket, job.key
    # the job as Plan handed it to the Map and Merge; the Map's concurrency is the Map's alone
    state = Planned(
        job_id=job_id,
        bucket=bucket,
        key=key,
        etag=job.etag,
        manifest_key=manifest_key(job_id),
        output_prefix=output_prefix(key),
        map_concurrency=0,
        duplicate=False,
        shards=shards,
    )
    if _manifest_exists(s3, bucket, state.manifest_key):
        summary = merge_job(
            s3=s3,
            store=store,
            state=state,
            status=JobStatus.CANCELLED,
            missing_code=ErrorCode.CANCELLED,
            missing_message=f"the job was cancelled before this line finished ({reason})",
            error=f"cancelled: {reason}",
        )
    else:
        # cancelled while planning: no shards yet, so there is nothing to account for line by line
        summary = Summary(
            job_id=job_id,
            status=JobStatus.CANCELLED,
            input=f"s3://{bucket}/{key}",
            error=f"cancelled while planning: {reason}",
        )
        end_job(s3, store, summary, bucket=bucket, prefix=state.output_prefix)
    report.summary = summary.to_json()
    return report
