"""Amazon Bedrock batch inference's side of the stack: the service role a job runs as, and the rule
that hears its "Batch Inference Job State Change" events and hands the ended ones to the function
that wakes the shard waiting on the job (`wakes`: the webhook function; polling is the fallback).
The stack builds it, and grants Bedrock's actions, only for an environment whose provider is Bedrock.

The role is Bedrock's to assume, and only for a model invocation job of this account (the confused
deputy conditions AWS documents); what it may do to the job bucket, and the batch steps' right to
pass it, are granted by the stack (`grant_bedrock_batch`, which it calls, kept here beside the role).
"""

from __future__ import annotations

import aws_cdk as cdk
import aws_cdk.aws_events as events
import aws_cdk.aws_events_targets as targets
import aws_cdk.aws_iam as iam
import aws_cdk.aws_lambda as lambda_
from constructs import Construct
from sluice.contract import BEDROCK_INPUT_PREFIX as INPUT
from sluice.contract import BEDROCK_OUTPUT_PREFIX as OUTPUT
from sluice.contract import PROVIDER_STEPS, SHARD_FAILED_STEP, Settings, bedrock_job_name_prefix

from infra.grants import Grants

BEDROCK_SERVICE = "bedrock.amazonaws.com"
# the steps that run a batch shard's batches, Bedrock's included, which may pass the role
BATCH_STEPS = ("submit_batch", "collect_batch")
# where they read the role's ARN (`Settings.bedrock_batch_role_arn`)
ROLE_VARIABLE = Settings.variable("bedrock_batch_role_arn")
# what a job may name as its model: a foundation model, a cross-region inference profile (system
# defined, `us.`...), or an application inference profile (the account's own, by ARN, often made to
# tag costs per team). The two kinds of profile are the account's; foundation models are AWS's.
MODEL_KINDS = ("foundation-model", "inference-profile", "application-inference-profile")
PROFILE_KINDS = MODEL_KINDS[1:]
EVENT_SOURCE = "aws.bedrock"
EVENT_DETAIL_TYPE = "Batch Inference Job State Change"
# the states after which a job's answers will not change: the ones worth waking a shard for
ENDED_STATES = ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired")
# what IAM sets to the inference profile's ARN when a request reaches a model through one
PROFILE_CONDITION_KEY = "bedrock:InferenceProfileArn"


class BedrockBatch(Construct):
    def __init__(self, scope: Construct, id: str, *, env_name: str, wakes: lambda_.IFunction) -> None:
        super().__init__(scope, id)
        stack = cdk.Stack.of(self)
        self.job_arns = stack.format_arn(
            service="bedrock",
            resource="model-invocation-job",
            resource_name="*",
            arn_format=cdk.ArnFormat.SLASH_RESOURCE_NAME,
        )
        profiles = [stack.format_arn(service="bedrock", resource=kind, resource_name="*") for kind in PROFILE_KINDS]
        self.model_arns = [
            stack.format_arn(service="bedrock", account="", resource=MODEL_KINDS[0], resource_name="*"),
            *profiles,
        ]
        # A cross-region inference profile (`us.`, `eu.`, `apac.`, `global.` ids) sends each request on
        # to a foundation model in one of its destination regions, and IAM checks the caller for that
        # model there too; the destinations are the profile's and change as AWS adds regions, so the
        # statement names every region's models, but only as reached through this account's profiles
        # of the stack's region (https://docs.aws.amazon.com/bedrock/latest/userguide/inference-profiles-prereq.html).
        # An application inference profile made from a cross-region one routes the same way, and IAM
        # names it in the same condition key.
        self.routed_model_arns = [
            stack.format_arn(service="bedrock", region="*", account="", resource=MODEL_KINDS[0], resource_name="*")
        ]
        self.routed_condition: dict[str, object] = {"StringLike": {PROFILE_CONDITION_KEY: profiles}}
        self.service_role = iam.Role(
            self,
            "ServiceRole",
            description=f"Sluice {env_name}: what Bedrock batch inference jobs read and write in the job bucket.",
            assumed_by=iam.ServicePrincipal(BEDROCK_SERVICE).with_conditions(
                {
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnLike": {"aws:SourceArn": self.job_arns},
                }
            ),
        )
        self.job_state_rule = events.Rule(
            self,
            "JobStateChanged",
            description=f"Sluice {env_name}: a Bedrock batch inference job ended; wake the shard waiting on it.",
            event_pattern=events.EventPattern(
                source=[EVENT_SOURCE],
                detail_type=[EVENT_DETAIL_TYPE],
                # this stack's own jobs only: the account's other batch jobs, other environments'
                # among them, are not this stack's to hear
                detail={
                    "status": list(ENDED_STATES),
                    "batchJobName": events.Match.prefix(bedrock_job_name_prefix(env_name)),
                },
            ),
            # the function that wakes a shard on a provider's webhook wakes it on this event too
            targets=[targets.LambdaFunction(wakes, retry_attempts=2)],
        )


def grant_bedrock_invoke(grants: Grants, bedrock: BedrockBatch) -> None:
    """The steps that send requests directly (a direct shard, a batch's part below Bedrock's minimum,
    its records left unanswered) invoke the region's foundation models and this account's inference
    profiles; Converse is authorized as InvokeModel."""
    why = "A line names its model: a foundation model of the region, or an inference profile of the account."
    grants.allow_steps(PROVIDER_STEPS, ["bedrock:InvokeModel"], bedrock.model_arns, wildcard_reason=why)
    why = "A cross-region inference profile routes to its model in any of its destination regions."
    grants.allow_steps(
        PROVIDER_STEPS,
        ["bedrock:InvokeModel"],
        bedrock.routed_model_arns,
        conditions=bedrock.routed_condition,
        wildcard_reason=why,
    )


def grant_bedrock_batch(grants: Grants, bedrock: BedrockBatch) -> None:
    """The stack's grants for Bedrock batch inference: its service role reads the jobs' input and
    writes their output; the batch steps put the input, read and delete both, and pass that role,
    to Bedrock only."""
    role, why = bedrock.service_role, "Each job's files are named by the job and shard they run."
    prefixes: dict[str, object] = {"StringLike": {"s3:prefix": [f"{p}*" for p in (INPUT, OUTPUT)]}}
    bucket = grants.bucket.bucket_arn
    # Bedrock acts as the role: the bucket must be this account's, whatever a job file names
    own: dict[str, object] = {"StringEquals": {"aws:ResourceAccount": grants.stack.account}}
    grants.allow(role, ["s3:GetObject"], grants.objects(INPUT), conditions=own, wildcard_reason=why)
    grants.allow(role, ["s3:PutObject"], grants.objects(OUTPUT), conditions=own, wildcard_reason=why)
    grants.allow(role, ["s3:ListBucket"], [bucket], conditions={**prefixes, **own})
    # a job that names a cross-region inference profile runs its records on the profile's models
    # in their regions, as the role
    why = "A job names its model: an inference profile of the account, routed to any destination region."
    grants.allow(role, ["bedrock:InvokeModel"], bedrock.model_arns[1:], wildcard_reason=why)
    grants.allow(
        role,
        ["bedrock:InvokeModel"],
        bedrock.routed_model_arns,
        conditions=bedrock.routed_condition,
        wildcard_reason=why,
    )
    allow = grants.allow_steps
    allow(BATCH_STEPS, ["s3:PutObject"], grants.objects(INPUT), wildcard_reason=why)
    allow(BATCH_STEPS, ["s3:GetObject", "s3:DeleteObject"], grants.objects(INPUT, OUTPUT), wildcard_reason=why)
    allow(BATCH_STEPS, ["s3:ListBucket"], [bucket], conditions=prefixes)
    passed: dict[str, object] = {"StringEquals": {"iam:PassedToService": BEDROCK_SERVICE}}
    allow(BATCH_STEPS, ["iam:PassRole"], [role.role_arn], conditions=passed)
    jobs = [f"bedrock:{call}ModelInvocationJob" for call in ("Create", "Get", "Stop")]
    why = "A job's ARN is Bedrock's, known once it is created; its model is whichever the job file names."
    allow(BATCH_STEPS, jobs, [bedrock.job_arns, *bedrock.model_arns], wildcard_reason=why)
    # CreateModelInvocationJob tags the job with its Sluice job id, which IAM authorizes as TagResource
    allow(BATCH_STEPS, ["bedrock:TagResource"], [bedrock.job_arns], wildcard_reason=why)
    why = "ListModelInvocationJobs supports no resource-level permission."
    allow(BATCH_STEPS, ["bedrock:ListModelInvocationJobs"], ["*"], wildcard_reason=why)
    # a failed shard's open jobs are stopped, and their state read, by ShardFailed; a failed job's by MarkFailed
    allow([SHARD_FAILED_STEP, "mark_failed"], jobs[1:], [bedrock.job_arns], wildcard_reason=why)
    for step in BATCH_STEPS:
        grants.by_step[step].add_environment(ROLE_VARIABLE, role.role_arn)
