"""What the state machine's steps may do: their log groups, their table actions, the job's files in
S3, the response cache and the batch turnarounds, the provider's key, the job's events. The stack
calls `grant_steps` once its constructs exist."""

from __future__ import annotations

import aws_cdk.aws_dynamodb as dynamodb
from sluice.contract import (
    ANY_SHARD_PREFIX,
    CACHE_PREFIX,
    INBOX_PREFIX,
    JOBS_PREFIX,
    OUTBOX_PREFIX,
    PROVIDER_STEPS,
    SHARD_FAILED_STEP,
    TURNAROUNDS_PREFIX,
    refused_summaries,
)

from infra.functions import EVENT_BUS, Functions
from infra.grants import Grants
from infra.secrets import Secrets
from infra.table_access import TABLE_ACTIONS

# The step that parks a shard's task token and wakes the shard if its work already settled.
TASK_TOKEN_STEPS = ("await_shard",)
# The steps that assemble outbox/ from the shards' files.
OUTPUT_STEPS = ("merge", "mark_failed")
# the steps that cancel work at the provider outside a shard's own run: a failed shard's, a failed job's
CANCELLING_STEPS = (SHARD_FAILED_STEP, "mark_failed")
# The steps that announce how a job ended (Merge's outcome goes out through Notify).
EVENT_STEPS = ("notify", "mark_failed")

# The Service Authorization Reference lists no resource type for states:SendTaskSuccess (nor
# SendTaskFailure, SendTaskHeartbeat), and says an action without one takes "Resource": "*"
# (https://docs.aws.amazon.com/service-authorization/latest/reference/list_awsstepfunctions.html);
# which ARN a Distributed Map child's token would be checked against is not documented. The token
# is what authorizes the call: it is unguessable and names one waiting task.
CALLBACK_REASON = (
    "SendTaskSuccess has no resource type in the Service Authorization Reference, so the documented form is "
    '"Resource": "*"; the task token itself names the one waiting task.'
)


def grant_steps(grants: Grants, *, functions: Functions, table: dynamodb.ITable, secrets: Secrets) -> None:
    """The steps' functions: their log groups, their table actions, and the job's files in S3."""
    by_step = functions.by_step
    allow = grants.allow_steps
    inbox = "Jobs read whichever input object started them; users choose the keys under inbox/."
    jobs = "Each job's working files live under jobs/<job id>/, which exists only once the job runs."
    outbox = "Results are written under outbox/ with names taken from the input object."

    for step, function in by_step.items():
        functions.log_groups[step].grant_write(function)
        if TABLE_ACTIONS[step]:
            allow([step], list(TABLE_ACTIONS[step]), [table.table_arn])

    # HeadObject is authorised by s3:GetObject, so Plan can read the ETag and metadata.
    allow(["plan"], ["s3:GetObject"], grants.objects(INBOX_PREFIX), wildcard_reason=inbox)
    # in a versioned bucket every read of the input names the version Plan cut (`input_pin`)
    readers = ["plan", *PROVIDER_STEPS, SHARD_FAILED_STEP, "mark_failed"]
    allow(readers, ["s3:GetObjectVersion"], grants.objects(INBOX_PREFIX), wildcard_reason=inbox)
    allow(["plan"], ["s3:PutObject"], grants.objects(JOBS_PREFIX), wildcard_reason=jobs)

    allow(
        PROVIDER_STEPS,
        ["s3:GetObject"],
        grants.objects(INBOX_PREFIX, JOBS_PREFIX),
        wildcard_reason=f"{inbox} {jobs}",
    )
    allow(PROVIDER_STEPS, ["s3:PutObject"], grants.objects(JOBS_PREFIX), wildcard_reason=jobs)
    api_key = secrets.api_key
    if api_key is not None:
        allow(PROVIDER_STEPS, ["secretsmanager:GetSecretValue"], [api_key.secret_arn])
        if not secrets.created:
            for step in PROVIDER_STEPS:
                grants.allow_secret_decrypt(by_step[step].role, api_key.secret_arn)

    # ShardFailed reads its shard's lines and parts, and writes its outputs, under jobs/; it
    # needs the key only to cancel the shard's open work
    allow([SHARD_FAILED_STEP], ["s3:GetObject"], grants.objects(INBOX_PREFIX, JOBS_PREFIX), wildcard_reason=inbox)
    allow(
        [SHARD_FAILED_STEP],
        ["s3:PutObject"],
        [
            grants.bucket.arn_for_objects(ANY_SHARD_PREFIX + name)
            for name in ("results.jsonl", "errors.jsonl", "stats.json")
        ],
        wildcard_reason="A failed shard's outputs are under jobs/<job id>/shards/<shard>/, named when it runs.",
    )
    if api_key is not None:
        allow(CANCELLING_STEPS, ["secretsmanager:GetSecretValue"], [api_key.secret_arn])
        if not secrets.created:
            for step in CANCELLING_STEPS:
                grants.allow_secret_decrypt(by_step[step].role, api_key.secret_arn)

    # UploadPartCopy needs GetObject on the source part and PutObject on the target.
    allow(OUTPUT_STEPS, ["s3:GetObject"], grants.objects(JOBS_PREFIX), wildcard_reason=jobs)
    allow(
        OUTPUT_STEPS,
        ["s3:PutObject", "s3:AbortMultipartUpload"],
        grants.objects(OUTBOX_PREFIX),
        wildcard_reason=outbox,
    )
    # Plan's one write to outbox/: the summary of a job it refused because the key's job runs
    allow(
        ["plan"],
        ["s3:PutObject"],
        [grants.bucket.arn_for_objects(refused_summaries(OUTBOX_PREFIX))],
        wildcard_reason="A refused job's summary is named by its input key and job id, known only when it runs.",
    )
    # A failed job still accounts for every line: MarkFailed first finishes the shards that
    # never did (`sluice.shard.frame.assemble`), which reads their lines from the input and writes each
    # shard's final files and nothing else under jobs/, then concatenates them into outbox/ as
    # Merge would.
    allow(["mark_failed"], ["s3:GetObject"], grants.objects(INBOX_PREFIX), wildcard_reason=inbox)
    allow(
        ["mark_failed"],
        ["s3:PutObject"],
        [
            grants.bucket.arn_for_objects(ANY_SHARD_PREFIX + name)
            for name in ("results.jsonl", "errors.jsonl", "stats.json")
        ],
        wildcard_reason="A failed job's shards are under jobs/<job id>/shards/<shard>/, named only when it runs.",
    )
    default_bus = grants.stack.format_arn(service="events", resource="event-bus", resource_name=EVENT_BUS)
    allow(EVENT_STEPS, ["events:PutEvents"], [default_bus])

    # Without ListBucket a missing checkpoint reads as 403 instead of 404.
    allow(
        [*PROVIDER_STEPS, SHARD_FAILED_STEP, *OUTPUT_STEPS],
        ["s3:ListBucket"],
        [grants.bucket.bucket_arn],
        conditions={"StringLike": {"s3:prefix": [JOBS_PREFIX, f"{JOBS_PREFIX}*"]}},
    )

    _grant_cache(grants)
    _grant_turnarounds(grants)

    # AwaitShard wakes its own shard when nothing is left to wait for; it never fails a task
    allow(TASK_TOKEN_STEPS, ["states:SendTaskSuccess"], ["*"], wildcard_reason=CALLBACK_REASON)


def _grant_cache(grants: Grants) -> None:
    """The response cache (`sluice.cache.entries`): Plan reads the indexes and the hits' segments; the
    steps that get answers add a segment and its index; Merge compacts the indexes
    (`sluice.cache.compact`: reads, writes and deletes under cache/index/, lists segments).
    Nothing deletes a segment (the lifecycle rule does)."""
    allow = grants.allow_steps
    cache = "Response cache objects are named by the job, shard and run that wrote them, under cache/."
    cache_index = f"{CACHE_PREFIX}index/"
    allow(["plan"], ["s3:GetObject"], grants.objects(CACHE_PREFIX), wildcard_reason=cache)
    allow(
        ["merge"],
        ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
        grants.objects(cache_index),
        wildcard_reason=cache,
    )
    allow(
        ["plan", "merge"],
        ["s3:ListBucket"],
        [grants.bucket.bucket_arn],
        # all of cache/, so that a segment the lifecycle rule expired reads as 404 (a miss), not 403
        conditions={"StringLike": {"s3:prefix": [CACHE_PREFIX, f"{CACHE_PREFIX}*"]}},
    )
    allow(
        PROVIDER_STEPS,
        ["s3:PutObject"],
        grants.objects(f"{CACHE_PREFIX}segments/", cache_index),
        wildcard_reason=cache,
    )


def _grant_turnarounds(grants: Grants) -> None:
    """The batch turnarounds measured of earlier jobs (`sluice.plan.turnarounds`): Merge reads and
    rewrites a model's object, a deadline job's Plan reads it. Both list the prefix, so that a
    model nothing was measured of yet reads as 404 (none measured), not 403."""
    allow = grants.allow_steps
    why = "Batch turnarounds are kept one object per provider family and model, under turnarounds/."
    allow(["plan"], ["s3:GetObject"], grants.objects(TURNAROUNDS_PREFIX), wildcard_reason=why)
    allow(["merge"], ["s3:GetObject", "s3:PutObject"], grants.objects(TURNAROUNDS_PREFIX), wildcard_reason=why)
    allow(
        ["plan", "merge"],
        ["s3:ListBucket"],
        [grants.bucket.bucket_arn],
        conditions={"StringLike": {"s3:prefix": [TURNAROUNDS_PREFIX, f"{TURNAROUNDS_PREFIX}*"]}},
    )
