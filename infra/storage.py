"""Where jobs live: the bucket (inbox/, jobs/, outbox/) and the state table."""

from __future__ import annotations

import aws_cdk as cdk
import aws_cdk.aws_dynamodb as dynamodb
import aws_cdk.aws_s3 as s3
from constructs import Construct
from sluice.contract import (
    BEDROCK_BATCH_PREFIX,
    CACHE_PREFIX,
    INBOX_PREFIX,
    JOBS_PREFIX,
    OUTBOX_PREFIX,
    PARTITION_KEY,
    PROVIDER_ID_ATTRIBUTE,
    PROVIDER_ID_INDEX,
    PROVIDER_ID_PROJECTION,
    SORT_KEY,
    TTL_ATTRIBUTE,
    TURNAROUNDS_PREFIX,
)

# S3 server access logs are for audits after the fact; a quarter covers the usual look-back.
ACCESS_LOG_DAYS = 90


class Storage(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        ttl_days: int,
        versioned: bool,
        point_in_time_recovery: bool,
        removal_policy: cdk.RemovalPolicy,
        cache_ttl_days: int = 30,
        provider_index: bool = True,
        warm_writes_per_s: int = 0,
        warm_reads_per_s: int = 0,
    ) -> None:
        super().__init__(scope, id)
        destroy = removal_policy == cdk.RemovalPolicy.DESTROY

        # Server access logs must go to a bucket with SSE-S3, not KMS, so both buckets use it.
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=[s3.LifecycleRule(expiration=cdk.Duration.days(ACCESS_LOG_DAYS))],
            removal_policy=removal_policy,
            auto_delete_objects=destroy,
        )

        self.bucket = s3.Bucket(
            self,
            "Bucket",
            event_bridge_enabled=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=versioned,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="bucket/",
            lifecycle_rules=_lifecycle_rules(ttl_days=ttl_days, cache_ttl_days=cache_ttl_days, versioned=versioned),
            removal_policy=removal_policy,
            auto_delete_objects=destroy,
        )

        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name=PARTITION_KEY, type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name=SORT_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            time_to_live_attribute=TTL_ATTRIBUTE,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=point_in_time_recovery,
            ),
            deletion_protection=not destroy,
            removal_policy=removal_policy,
            # pre-warmed where the environment asks (0: a new table's own warm throughput)
            warm_throughput=dynamodb.WarmThroughput(
                write_units_per_second=warm_writes_per_s or None,
                read_units_per_second=warm_reads_per_s or None,
            )
            if warm_writes_per_s or warm_reads_per_s
            else None,
        )
        # Sparse: only items that were handed to a provider carry `provider_id`, so a webhook
        # can find its item without the index holding every row. Keys only: its one reader
        # (`JobStore._by_provider_id`) wants the row's key, then reads or updates the row itself,
        # so each indexed write copies a few bytes instead of the whole row. CloudFormation cannot
        # change an index's projection in place: a stack that has it with another projection drops
        # it in one deploy (`provider_index=False`) and builds it again in the next.
        self.indexes = [PROVIDER_ID_INDEX] if provider_index else []
        for index in self.indexes:
            self.table.add_global_secondary_index(
                index_name=index,
                partition_key=dynamodb.Attribute(name=PROVIDER_ID_ATTRIBUTE, type=dynamodb.AttributeType.STRING),
                projection_type=dynamodb.ProjectionType[PROVIDER_ID_PROJECTION],
            )


def _lifecycle_rules(*, ttl_days: int, cache_ttl_days: int, versioned: bool) -> list[s3.LifecycleRule]:
    """What the bucket expires, by prefix: a job's files (Bedrock batch inference's among them), the
    response cache, replaced inputs and results, and multipart uploads left incomplete."""
    jobs_rule = s3.LifecycleRule(
        id="expire-jobs",
        prefix=JOBS_PREFIX,
        expiration=cdk.Duration.days(ttl_days),
        noncurrent_version_expiration=cdk.Duration.days(1) if versioned else None,
    )
    # Bedrock batch inference's input and output files are a job's working files kept elsewhere
    # (Bedrock reads and writes them under its own prefix): they go when the job's files go
    bedrock_rule = s3.LifecycleRule(
        id="expire-bedrock-batch",
        prefix=BEDROCK_BATCH_PREFIX,
        expiration=cdk.Duration.days(ttl_days),
        noncurrent_version_expiration=cdk.Duration.days(1) if versioned else None,
    )
    # The response cache outlives jobs (a re-run weeks later is the point) but not forever:
    # an answer is kept this long after it was written, then paid for again if asked again.
    cache_rule = s3.LifecycleRule(
        id="expire-cache",
        prefix=CACHE_PREFIX,
        expiration=cdk.Duration.days(cache_ttl_days),
        noncurrent_version_expiration=cdk.Duration.days(1) if versioned else None,
    )
    # Inputs and results are the users' to delete. With versioning on, a replaced or deleted one
    # stays restorable as long as a job's files are kept, then goes.
    kept_rules = [
        s3.LifecycleRule(
            id=f"expire-noncurrent-{prefix.strip('/')}",
            prefix=prefix,
            noncurrent_version_expiration=cdk.Duration.days(ttl_days),
        )
        for prefix in (INBOX_PREFIX, OUTBOX_PREFIX)
        if versioned
    ]
    # With versioning on, every expiration and every delete above leaves a delete marker, which
    # outlives the versions it hid: millions of jobs' working files would leave millions of markers,
    # each listed by every version listing. One rule for the whole bucket removes a marker once it
    # is the last version of its key (S3 takes no days with this, and no expiration in the same rule).
    markers_rule = s3.LifecycleRule(id="expire-delete-markers", expired_object_delete_marker=True)
    # The batch turnarounds measured outlive every job (the next deadline plan reads them), so only
    # what each Merge's rewrite replaced goes; a versioned bucket would keep one version a job
    turnarounds_rule = s3.LifecycleRule(
        id="expire-noncurrent-turnarounds",
        prefix=TURNAROUNDS_PREFIX,
        noncurrent_version_expiration=cdk.Duration.days(1),
    )
    # Merge writes outbox/ objects with multipart uploads; a failed one would bill forever.
    abort_uploads = s3.LifecycleRule(
        id="abort-incomplete-uploads",
        abort_incomplete_multipart_upload_after=cdk.Duration.days(1),
    )
    versioned_rules = [turnarounds_rule, markers_rule] if versioned else []
    return [jobs_rule, bedrock_rule, cache_rule, *kept_rules, *versioned_rules, abort_uploads]
