"""Bedrock in the stack of an environment whose provider is Bedrock: a service role only Bedrock may
assume, for this account's jobs; it reads the jobs' input and writes their output and nothing else;
the batch steps may pass it, to Bedrock only; a rule hears the jobs' ended states; the steps that
send directly invoke the region's models; and no API key is held. An OpenAI environment has none
of Bedrock's grants, role or rule."""

from __future__ import annotations

from typing import Any

import pytest
from sluice.contract import PROVIDER_STEPS, READS, ProviderKey

from sluice_local.iam import ACCOUNT, REGION, allows, policies_from_template
from tests.infra.conftest import BEDROCK_ENV, Synthesis
from tests.infra.helpers.functions import step_functions
from tests.infra.helpers.security import _listed, _role_statements, _statements
from tests.infra.helpers.workflow import _flat

ENDED = ["Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"]


def _service_role(synthesis: Synthesis, env: str) -> tuple[str, dict[str, Any]]:
    roles = [
        (logical, role)
        for logical, role in synthesis.resources(env, "AWS::IAM::Role").items()
        if any(
            "bedrock.amazonaws.com" in _listed(s["Principal"].get("Service", []))
            for s in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        )
    ]
    assert len(roles) == 1
    return roles[0]


def test_only_bedrock_assumes_the_service_role_and_only_for_this_accounts_jobs(bedrock_synthesis: Synthesis) -> None:
    synthesis, env = bedrock_synthesis, BEDROCK_ENV
    _, role = _service_role(synthesis, env)
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "bedrock.amazonaws.com"} and trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    (arn,) = trust["Condition"]["ArnLike"].values()
    assert _flat(arn).endswith(":model-invocation-job/*") and ":bedrock:" in _flat(arn)


def test_the_service_role_reads_the_input_and_writes_the_output_only(bedrock_synthesis: Synthesis) -> None:
    synthesis, env = bedrock_synthesis, BEDROCK_ENV
    logical, _ = _service_role(synthesis, env)
    granted = set()
    for statement in _service_role_statements(synthesis, env, logical):
        if any(a.startswith("s3:") for a in _listed(statement["Action"])):
            # and only in this account's bucket, whatever a job file names
            assert statement["Condition"]["StringEquals"] == {"aws:ResourceAccount": {"Ref": "AWS::AccountId"}}
            for resource in _listed(statement["Resource"]):
                suffix = _flat(resource).split(".Arn>", 1)[1].lstrip("/")
                granted |= {(action, suffix) for action in _listed(statement["Action"])}
    assert granted == {
        ("s3:GetObject", "bedrock-batch/input/*"),
        ("s3:PutObject", "bedrock-batch/output/*"),
        ("s3:ListBucket", ""),
    }


def _service_role_statements(synthesis: Synthesis, env: str, logical: str) -> list[dict[str, Any]]:
    return [
        statement
        for policy in synthesis.resources(env, "AWS::IAM::Policy").values()
        if {"Ref": logical} in policy["Properties"]["Roles"]
        for statement in _statements(policy["Properties"]["PolicyDocument"])
    ]


def test_the_batch_steps_pass_the_service_role_to_bedrock_only(bedrock_synthesis: Synthesis) -> None:
    synthesis, env = bedrock_synthesis, BEDROCK_ENV
    logical, _ = _service_role(synthesis, env)
    for step, function in step_functions(synthesis, env).items():
        statements = _role_statements(synthesis, env, function)
        passes = [s for s in statements if "iam:PassRole" in _listed(s["Action"])]
        # InvokeModel is every direct sender's (below); the rest is the batch steps' alone
        bedrock = {a for s in statements for a in _listed(s["Action"]) if a.startswith("bedrock:")}
        bedrock.discard("bedrock:InvokeModel")
        if step in ("fail_shard", "mark_failed"):
            # a failed shard's or job's open jobs are stopped and read, nothing else
            assert not passes and bedrock == {"bedrock:GetModelInvocationJob", "bedrock:StopModelInvocationJob"}
            continue
        if step not in ("submit_batch", "collect_batch"):
            assert not passes and not bedrock, step
            continue
        (passed,) = passes
        assert passed["Resource"] == {"Fn::GetAtt": [logical, "Arn"]}
        assert passed["Condition"] == {"StringEquals": {"iam:PassedToService": "bedrock.amazonaws.com"}}
        jobs = {f"bedrock:{call}ModelInvocationJob" for call in ("Create", "Get", "Stop")}
        assert bedrock == {*jobs, "bedrock:ListModelInvocationJobs", "bedrock:TagResource"}
        # a job is created with its Sluice job id as a tag, which IAM authorizes as TagResource
        (tags,) = [s for s in statements if "bedrock:TagResource" in _listed(s["Action"])]
        assert _flat(tags["Resource"]).endswith(":model-invocation-job/*")
        variables = function["Properties"]["Environment"]["Variables"]
        assert variables["SLUICE_BEDROCK_BATCH_ROLE_ARN"] == {"Fn::GetAtt": [logical, "Arn"]}


def test_a_rule_hears_the_jobs_ended_states(bedrock_synthesis: Synthesis) -> None:
    synthesis, env = bedrock_synthesis, BEDROCK_ENV
    patterns = [rule["Properties"]["EventPattern"] for rule in synthesis.resources(env, "AWS::Events::Rule").values()]
    assert {
        "source": ["aws.bedrock"],
        "detail-type": ["Batch Inference Job State Change"],
        "detail": {"status": ENDED, "batchJobName": [{"prefix": f"sluice-{env}-"}]},
    } in patterns
    # the jobs the batch steps create are named by the same prefix, the environment's own
    for step in ("submit_batch", "collect_batch"):
        variables = step_functions(synthesis, env)[step]["Properties"]["Environment"]["Variables"]
        assert variables["SLUICE_BEDROCK_JOB_PREFIX"] == f"sluice-{env}-"


def _bedrock_actions(synthesis: Synthesis, env: str) -> dict[str, set[str]]:
    return {
        step: {a for s in _role_statements(synthesis, env, function) for a in _listed(s["Action"]) if "bedrock:" in a}
        for step, function in step_functions(synthesis, env).items()
    }


PROFILE = "us.anthropic.claude-3-5-haiku-20241022-v1:0"
ROUTED_TO = "anthropic.claude-3-5-haiku-20241022-v1:0"


def test_the_steps_that_send_directly_invoke_the_regions_models_and_the_accounts_profiles(
    bedrock_synthesis: Synthesis,
) -> None:
    policies = policies_from_template(bedrock_synthesis.raw[BEDROCK_ENV])
    for step in step_functions(bedrock_synthesis, BEDROCK_ENV):
        statements = policies[step]
        model = f"arn:aws:bedrock:{REGION}::foundation-model/{ROUTED_TO}"
        elsewhere = f"arn:aws:bedrock:us-west-2::foundation-model/{ROUTED_TO}"
        if step not in PROVIDER_STEPS:
            assert not allows(statements, "bedrock:InvokeModel", model), step
            continue
        assert allows(statements, "bedrock:InvokeModel", model), step
        assert allows(
            statements, "bedrock:InvokeModel", f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{PROFILE}"
        )
        # another region's model only as a profile of the account routes to it
        assert not allows(statements, "bedrock:InvokeModel", elsewhere), step
        assert not allows(statements, "bedrock:InvokeModel", f"arn:aws:bedrock:us-west-2:{ACCOUNT}:inference-profile/x")


@pytest.mark.parametrize("region", ["us-east-1", "us-east-2", "us-west-2"])
@pytest.mark.parametrize("who", [*PROVIDER_STEPS, "bedrock_batch"])
def test_a_cross_region_profile_reaches_its_model_in_every_destination_region(
    bedrock_synthesis: Synthesis, who: str, region: str
) -> None:
    """`us.` routes to us-east-1, us-east-2 and us-west-2: IAM checks the model there too, for a direct
    request (the sending steps) and for a batch job's records (the role Bedrock runs the job as)."""
    statements = policies_from_template(bedrock_synthesis.raw[BEDROCK_ENV])[who]
    profile = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/{PROFILE}"
    context = {"bedrock:InferenceProfileArn": profile}
    assert allows(statements, "bedrock:InvokeModel", profile)
    model = f"arn:aws:bedrock:{region}::foundation-model/{ROUTED_TO}"
    assert allows(statements, "bedrock:InvokeModel", model, context), (who, region)
    other = {"bedrock:InferenceProfileArn": f"arn:aws:bedrock:{REGION}:999999999999:inference-profile/{PROFILE}"}
    assert not allows(statements, "bedrock:InvokeModel", model, other) or region == REGION


APPLICATION_PROFILE = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:application-inference-profile/a1b2c3d4e5f6"


@pytest.mark.parametrize("who", [*PROVIDER_STEPS, "bedrock_batch"])
def test_an_application_inference_profile_of_the_account_reaches_its_models(
    bedrock_synthesis: Synthesis, who: str
) -> None:
    """A model named by an application inference profile's ARN (the account's own, made to tag
    costs): the sender invokes the profile, and its model as reached through it; another account's
    profile, or one of another region, is not granted."""
    statements = policies_from_template(bedrock_synthesis.raw[BEDROCK_ENV])[who]
    assert allows(statements, "bedrock:InvokeModel", APPLICATION_PROFILE), who
    context = {"bedrock:InferenceProfileArn": APPLICATION_PROFILE}
    for region in ("us-east-1", "us-west-2"):
        model = f"arn:aws:bedrock:{region}::foundation-model/{ROUTED_TO}"
        assert allows(statements, "bedrock:InvokeModel", model, context), (who, region)
    elsewhere = APPLICATION_PROFILE.replace(ACCOUNT, "999999999999")
    assert not allows(statements, "bedrock:InvokeModel", elsewhere), who
    assert not allows(statements, "bedrock:InvokeModel", APPLICATION_PROFILE.replace(REGION, "eu-west-1")), who
    outside = f"arn:aws:bedrock:us-west-2::foundation-model/{ROUTED_TO}"
    assert not allows(statements, "bedrock:InvokeModel", outside, {"bedrock:InferenceProfileArn": elsewhere}), who


def test_the_local_cloud_lets_a_sender_name_its_model_by_an_application_profiles_arn(
    bedrock_synthesis: Synthesis,
) -> None:
    from sluice_local.iam import LocalIam

    policies = policies_from_template(bedrock_synthesis.raw[BEDROCK_ENV])
    local = LocalIam(admin_key_id="admin", admin_secret="secret", key_owners={"key": "run_shard"})
    assert local.may_invoke(policies, "key", REGION, APPLICATION_PROFILE) is None
    refused = local.may_invoke(policies, "key", REGION, APPLICATION_PROFILE.replace(ACCOUNT, "999999999999"))
    assert refused is not None and "application-inference-profile" in refused


def test_the_batch_steps_create_a_job_on_an_application_inference_profile(bedrock_synthesis: Synthesis) -> None:
    policies = policies_from_template(bedrock_synthesis.raw[BEDROCK_ENV])
    for step in ("submit_batch", "collect_batch"):
        assert allows(policies[step], "bedrock:CreateModelInvocationJob", APPLICATION_PROFILE), step
    assert not allows(policies["run_shard"], "bedrock:CreateModelInvocationJob", APPLICATION_PROFILE)


def test_a_bedrock_environment_holds_no_api_key(bedrock_synthesis: Synthesis) -> None:
    env = BEDROCK_ENV
    names = [s["Properties"]["Name"] for s in bedrock_synthesis.resources(env, "AWS::SecretsManager::Secret").values()]
    assert [n for n in names if "provider-api-key" in n] == [] and len(names) == 1
    for step, function in step_functions(bedrock_synthesis, env).items():
        # the steps that would read a key are told there is none; the others are given no such variable
        key = "none" if ProviderKey in READS[step] else None
        assert function["Properties"]["Environment"]["Variables"].get("SLUICE_API_KEY_SECRET_ARN") == key, step
        statements = _role_statements(bedrock_synthesis, env, function)
        assert not [s for s in statements if "secretsmanager:GetSecretValue" in _listed(s["Action"])], step
    assert "ApiKeySecretArn" not in bedrock_synthesis.raw[env].get("Outputs", {})


def test_an_environment_of_a_keyed_family_has_no_bedrock_grant_role_or_rule(synthesis: Synthesis, env: str) -> None:
    assert synthesis.stacks[env].config.provider in ("openai", "gemini")
    assert {step: actions for step, actions in _bedrock_actions(synthesis, env).items() if actions} == {}
    roles = synthesis.resources(env, "AWS::IAM::Role").values()
    trusted = [
        s
        for role in roles
        for s in role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        if "bedrock.amazonaws.com" in _listed(s["Principal"].get("Service", []))
    ]
    assert trusted == []
    rules = synthesis.resources(env, "AWS::Events::Rule").values()
    assert not [r for r in rules if r["Properties"].get("EventPattern", {}).get("source") == ["aws.bedrock"]]
    for function in step_functions(synthesis, env).values():
        assert "SLUICE_BEDROCK_BATCH_ROLE_ARN" not in function["Properties"]["Environment"]["Variables"]


def test_a_bedrock_environment_passes_cdk_nag(bedrock_synthesis: Synthesis) -> None:
    assert bedrock_synthesis.validation_error is None
