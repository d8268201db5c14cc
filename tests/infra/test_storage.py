from __future__ import annotations

from aws_cdk.assertions import Match

from tests.infra.conftest import Synthesis


def _job_bucket_id(synthesis: Synthesis, env: str) -> str:
    """The job bucket is the one whose access logs go to the other bucket."""
    buckets = synthesis.resources(env, "AWS::S3::Bucket")
    (bucket_id,) = [k for k, b in buckets.items() if "LoggingConfiguration" in b["Properties"]]
    return bucket_id


def _job_bucket(synthesis: Synthesis, env: str) -> dict:
    return synthesis.resources(env, "AWS::S3::Bucket")[_job_bucket_id(synthesis, env)]["Properties"]


def test_bucket_is_private_encrypted_and_sends_events_to_eventbridge(synthesis: Synthesis, env: str) -> None:
    props = _job_bucket(synthesis, env)
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] in ("AES256", "aws:kms")
    assert "DestinationBucketName" in props["LoggingConfiguration"]
    # CDK turns EventBridge delivery on through its bucket-notifications custom resource.
    synthesis.templates[env].has_resource_properties(
        "Custom::S3BucketNotifications",
        {
            "BucketName": {"Ref": _job_bucket_id(synthesis, env)},
            "NotificationConfiguration": {"EventBridgeConfiguration": {}},
        },
    )


def test_every_bucket_denies_requests_without_tls(synthesis: Synthesis, env: str) -> None:
    buckets = synthesis.resources(env, "AWS::S3::Bucket")
    policies = synthesis.resources(env, "AWS::S3::BucketPolicy").values()
    secured = {
        p["Properties"]["Bucket"]["Ref"]
        for p in policies
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if s["Effect"] == "Deny" and s.get("Condition") == {"Bool": {"aws:SecureTransport": "false"}}
    }
    assert secured == set(buckets)


def test_jobs_prefix_expires_after_ttl_days(synthesis: Synthesis, env: str) -> None:
    rules = _job_bucket(synthesis, env)["LifecycleConfiguration"]["Rules"]
    jobs = [r for r in rules if r.get("Prefix") == "jobs/"]
    assert [r["ExpirationInDays"] for r in jobs] == [synthesis.stacks[env].config.ttl_days]
    assert any(r.get("AbortIncompleteMultipartUpload") for r in rules)


def test_bedrock_batch_files_expire_with_the_jobs_files(synthesis: Synthesis, env: str) -> None:
    rules = _job_bucket(synthesis, env)["LifecycleConfiguration"]["Rules"]
    bedrock = [r for r in rules if r.get("Prefix") == "bedrock-batch/"]
    assert [r["ExpirationInDays"] for r in bedrock] == [synthesis.stacks[env].config.ttl_days]


def test_the_response_cache_expires_after_its_own_ttl_per_environment(synthesis: Synthesis, env: str) -> None:
    rules = _job_bucket(synthesis, env)["LifecycleConfiguration"]["Rules"]
    cache = [r for r in rules if r.get("Prefix") == "cache/"]
    days = synthesis.stacks[env].config.cache_ttl_days
    assert [(r["Id"], r["Status"], r["ExpirationInDays"]) for r in cache] == [("expire-cache", "Enabled", days)]
    # cdk.json sets it per environment, and a re-run months later should still find prod's answers
    assert {"dev": 7, "prod": 90, "gemini": 7}[env] == days


def test_every_prefix_expires_its_noncurrent_versions_where_versioning_keeps_them(
    synthesis: Synthesis, env: str
) -> None:
    from sluice.contract import (
        BEDROCK_BATCH_PREFIX,
        CACHE_PREFIX,
        INBOX_PREFIX,
        JOBS_PREFIX,
        OUTBOX_PREFIX,
        TURNAROUNDS_PREFIX,
    )

    props = _job_bucket(synthesis, env)
    config = synthesis.stacks[env].config
    if not config.versioning:
        assert "VersioningConfiguration" not in props
        return
    rules = props["LifecycleConfiguration"]["Rules"]
    noncurrent = {
        r.get("Prefix"): r["NoncurrentVersionExpiration"]["NoncurrentDays"]
        for r in rules
        if "NoncurrentVersionExpiration" in r
    }
    # a job's working files, the cache's and the turnarounds' expire as soon as they are replaced; an
    # input or result replaced or deleted by its user stays restorable as long as jobs are kept
    assert noncurrent == {
        JOBS_PREFIX: 1,
        BEDROCK_BATCH_PREFIX: 1,
        CACHE_PREFIX: 1,
        TURNAROUNDS_PREFIX: 1,
        INBOX_PREFIX: config.ttl_days,
        OUTBOX_PREFIX: config.ttl_days,
    }


def test_delete_markers_left_alone_expire_on_every_versioned_prefix(synthesis: Synthesis, env: str) -> None:
    """Expiring a job's files in a versioned bucket leaves a delete marker per object; once the
    versions under it have gone, a rule must remove it, on every prefix, or they pile up for good."""
    props = _job_bucket(synthesis, env)
    rules = props["LifecycleConfiguration"]["Rules"]
    markers = [r for r in rules if r.get("ExpiredObjectDeleteMarker")]
    if not synthesis.stacks[env].config.versioning:
        assert markers == []
        return
    # no prefix and no filter: the rule covers inbox/, outbox/, jobs/, cache/, bedrock-batch/ and turnarounds/
    assert [(r["Id"], r["Status"], r.get("Prefix"), r.get("Filter")) for r in markers] == [
        ("expire-delete-markers", "Enabled", None, None)
    ]
    # S3 refuses ExpiredObjectDeleteMarker beside an expiration in days in one rule
    assert "ExpirationInDays" not in markers[0]


def test_table_keys_billing_ttl_and_sparse_provider_index(synthesis: Synthesis, env: str) -> None:
    synthesis.templates[env].has_resource_properties(
        "AWS::DynamoDB::Table",
        {
            "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            "AttributeDefinitions": Match.array_with([{"AttributeName": "provider_id", "AttributeType": "S"}]),
            "BillingMode": "PAY_PER_REQUEST",
            "TimeToLiveSpecification": {"AttributeName": "expires_at", "Enabled": True},
            "SSESpecification": {"SSEEnabled": True},
            "GlobalSecondaryIndexes": [
                {
                    "IndexName": "by_provider_id",
                    "KeySchema": [{"AttributeName": "provider_id", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            ],
        },
    )


def test_prod_keeps_history_and_dev_does_not(synthesis: Synthesis) -> None:
    for env, expected in (("prod", True), ("dev", False)):
        versioning = _job_bucket(synthesis, env).get("VersioningConfiguration", {}).get("Status") == "Enabled"
        (table,) = synthesis.resources(env, "AWS::DynamoDB::Table").values()
        pitr = table["Properties"].get("PointInTimeRecoverySpecification", {})
        assert versioning is expected, env
        assert pitr.get("PointInTimeRecoveryEnabled", False) is expected, env


def test_removal_policies_follow_config(synthesis: Synthesis) -> None:
    (dev_table,) = synthesis.resources("dev", "AWS::DynamoDB::Table").values()
    (prod_table,) = synthesis.resources("prod", "AWS::DynamoDB::Table").values()
    assert dev_table["DeletionPolicy"] == "Delete"
    assert prod_table["DeletionPolicy"] == "Retain"
    assert prod_table["Properties"]["DeletionProtectionEnabled"] is True


def test_the_local_cloud_creates_the_table_the_stack_declares(synthesis: Synthesis, env: str) -> None:
    from sluice.contract import create_table_request

    (table,) = synthesis.resources(env, "AWS::DynamoDB::Table").values()
    declared = table["Properties"]
    local = create_table_request("jobs")
    assert declared["KeySchema"] == local["KeySchema"]
    assert sorted(declared["AttributeDefinitions"], key=str) == sorted(local["AttributeDefinitions"], key=str)
    assert declared["GlobalSecondaryIndexes"] == local["GlobalSecondaryIndexes"]
    assert declared["BillingMode"] == local["BillingMode"]


def test_the_provider_index_copies_only_keys_and_still_wakes_a_batch_shard() -> None:
    """Each write of an indexed row is copied to the index; KEYS_ONLY copies a few bytes, and its
    one reader (`settle_batch`, behind the webhook) needs no more than the row's key."""
    import boto3
    from moto import mock_aws
    from sluice.contract import PROVIDER_ID_INDEX, create_table_request
    from sluice.store.jobs import JobStore
    from sluice.store.keys import shard_key

    with mock_aws():
        boto3.client("dynamodb", region_name="us-east-1").create_table(**create_table_request("jobs"))
        table = boto3.resource("dynamodb", region_name="us-east-1").Table("jobs")
        row = {**shard_key("job", 3), "provider_id": "batch_1", "token": "token-3", "lines": 5000}
        table.put_item(Item=row)
        indexed = table.query(
            IndexName=PROVIDER_ID_INDEX,
            KeyConditionExpression="provider_id = :p",
            ExpressionAttributeValues={":p": "batch_1"},
        )["Items"]
        assert indexed == [{"pk": row["pk"], "sk": row["sk"], "provider_id": "batch_1"}]
        assert JobStore(table, ttl_days=1).settle_batch("batch_1", "completed") == "token-3"


def test_an_existing_stack_can_drop_the_index_for_one_deploy_to_rebuild_it() -> None:
    """CloudFormation refuses to change an index's projection in place; a stack deployed before
    KEYS_ONLY drops the index in one deploy and builds it again, keys only, in the next."""
    import aws_cdk as cdk
    from aws_cdk import assertions

    from infra.stack import WITHOUT_PROVIDER_INDEX, build_app
    from tests.infra.conftest import CONTEXT

    app = cdk.App(context={**CONTEXT, WITHOUT_PROVIDER_INDEX: True, "aws:cdk:bundling-stacks": []})
    template = assertions.Template.from_stack(build_app(app, ["prod"])["prod"])
    (table,) = template.find_resources("AWS::DynamoDB::Table").values()
    assert "GlobalSecondaryIndexes" not in table["Properties"]
    # the throttling alarm watches what exists
    (alarm,) = [a for a in template.find_resources("AWS::CloudWatch::Alarm").values() if "Metrics" in a["Properties"]]
    assert "GlobalSecondaryIndexName" not in str(alarm)


def test_prod_pre_warms_its_table_for_the_stated_scenario_and_dev_does_not(synthesis: Synthesis) -> None:
    """Background by webhook writes about 2,500 units a second at the stated scenario, over half a
    new table's 4,000: prod's table starts at its warm throughput instead (bench/capacity.py)."""
    (dev_table,) = synthesis.resources("dev", "AWS::DynamoDB::Table").values()
    (prod_table,) = synthesis.resources("prod", "AWS::DynamoDB::Table").values()
    assert "WarmThroughput" not in dev_table["Properties"]
    assert prod_table["Properties"]["WarmThroughput"] == {"WriteUnitsPerSecond": 10_000}
