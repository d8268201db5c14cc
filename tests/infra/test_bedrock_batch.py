"""Bedrock batch inference in the stack: a service role only Bedrock may assume, for this account's
jobs; it reads the jobs' input and writes their output and nothing else; the batch steps may pass
it, to Bedrock only; and a rule hears the jobs' ended states."""

from __future__ import annotations

from typing import Any

from tests.infra.conftest import Synthesis
from tests.infra.test_functions import step_functions
from tests.infra.test_security import _listed, _role_statements, _statements
from tests.infra.test_workflow import _flat

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


def test_only_bedrock_assumes_the_service_role_and_only_for_this_accounts_jobs(synthesis: Synthesis, env: str) -> None:
    _, role = _service_role(synthesis, env)
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "bedrock.amazonaws.com"} and trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    (arn,) = trust["Condition"]["ArnLike"].values()
    assert _flat(arn).endswith(":model-invocation-job/*") and ":bedrock:" in _flat(arn)


def test_the_service_role_reads_the_input_and_writes_the_output_only(synthesis: Synthesis, env: str) -> None:
    logical, _ = _service_role(synthesis, env)
    granted = set()
    for policy in synthesis.resources(env, "AWS::IAM::Policy").values():
        if {"Ref": logical} in policy["Properties"]["Roles"]:
            for statement in _statements(policy["Properties"]["PolicyDocument"]):
                for resource in _listed(statement["Resource"]):
                    suffix = _flat(resource).split(".Arn>", 1)[1].lstrip("/")
                    granted |= {(action, suffix) for action in _listed(statement["Action"])}
    assert granted == {
        ("s3:GetObject", "bedrock-batch/input/*"),
        ("s3:PutObject", "bedrock-batch/output/*"),
        ("s3:ListBucket", ""),
    }


def test_the_batch_steps_pass_the_service_role_to_bedrock_only(synthesis: Synthesis, env: str) -> None:
    logical, _ = _service_role(synthesis, env)
    for step, function in step_functions(synthesis, env).items():
        statements = _role_statements(synthesis, env, function)
        passes = [s for s in statements if "iam:PassRole" in _listed(s["Action"])]
        bedrock = {a for s in statements for a in _listed(s["Action"]) if a.startswith("bedrock:")}
        if step not in ("submit_batch", "collect_batch"):
            assert not passes and not bedrock, step
            continue
        (passed,) = passes
        assert passed["Resource"] == {"Fn::GetAtt": [logical, "Arn"]}
        assert passed["Condition"] == {"StringEquals": {"iam:PassedToService": "bedrock.amazonaws.com"}}
        jobs = {f"bedrock:{call}ModelInvocationJob" for call in ("Create", "Get", "Stop")}
        assert bedrock == {*jobs, "bedrock:ListModelInvocationJobs"}
        variables = function["Properties"]["Environment"]["Variables"]
        assert variables["SLUICE_BEDROCK_BATCH_ROLE_ARN"] == {"Fn::GetAtt": [logical, "Arn"]}


def test_a_rule_hears_the_jobs_ended_states(synthesis: Synthesis, env: str) -> None:
    patterns = [rule["Properties"]["EventPattern"] for rule in synthesis.resources(env, "AWS::Events::Rule").values()]
    assert {
        "source": ["aws.bedrock"],
        "detail-type": ["Batch Inference Job State Change"],
        "detail": {"status": ENDED},
    } in patterns
