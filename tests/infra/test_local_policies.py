"""The local cloud's IAM snapshot (sluice_local/policies.json) is what the stack synthesizes."""

from __future__ import annotations

from sluice_local.iam import (
    BEDROCK_BATCH,
    POLICIES,
    SNAPSHOT_ENV,
    WEBHOOK,
    WORKFLOW,
    Statement,
    load_policies,
    merged,
    moto_statements,
    policies_from_template,
)
from tests.infra.conftest import BEDROCK_ENV, Synthesis


def test_the_local_policies_are_the_synthesized_ones(synthesis: Synthesis, bedrock_synthesis: Synthesis) -> None:
    # a local run may name any family: the dev stack's grants, and those it has only on Bedrock
    synthesized = merged(
        policies_from_template(synthesis.raw[SNAPSHOT_ENV]), policies_from_template(bedrock_synthesis.raw[BEDROCK_ENV])
    )
    assert synthesized == load_policies(), f"{POLICIES} is stale: rewrite it with `make policies`"


def test_every_function_and_the_state_machine_have_their_statements() -> None:
    from sluice.contract import STEPS

    # and the role Bedrock batch inference jobs run as, whose grants the emulated jobs use
    assert set(load_policies()) == {*STEPS, WEBHOOK, WORKFLOW, BEDROCK_BATCH}


def test_moto_sees_s3_resources_on_the_local_bucket_and_every_other_resource_as_a_wildcard() -> None:
    statements: list[Statement] = [
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject", "dynamodb:GetItem"],
            "Resource": ["arn:aws:s3:::sluice-local-bucket/jobs/*", "arn:aws:dynamodb:us-east-1:1:table/t"],
        },
        {
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": "arn:aws:s3:::sluice-local-bucket",
            "Condition": {"StringLike": {"s3:prefix": ["jobs/"]}},
        },
    ]
    assert moto_statements(statements, bucket="other") == [
        {
            "Effect": "Allow",
            "Action": ["s3:GetObject"],
            "Resource": ["arn:aws:s3:::other/jobs/*", "arn:aws:dynamodb:us-east-1:1:table/t"],
        },
        {"Effect": "Allow", "Action": ["dynamodb:GetItem"], "Resource": "*"},
        {
            "Effect": "Allow",
            "Action": ["s3:ListBucket"],
            "Resource": ["arn:aws:s3:::other"],
            "Condition": {"StringLike": {"s3:prefix": ["jobs/"]}},
        },
    ]
