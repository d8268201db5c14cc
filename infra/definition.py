"""The Amazon States Language definition of a Sluice job.

Kept as plain data (no CDK import) so that the deployed state machine and the local runner
execute the very same document: the CDK stack passes it to `DefinitionBody.from_string`
with `definition_substitutions` for the function ARNs, and `local/` substitutes the ARNs
of the in-process functions.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.contract import STEPS

# One placeholder per Lambda step; the values are function ARNs.
FUNCTION_PLACEHOLDERS = {name: step.placeholder for name, step in STEPS.items()}

# The errorType a step fails with when an AWS call inside it was throttled or failed on the
# service's side after the SDK's own retries (`sluice.aws_errors.Transient`, turned so at the
# handler boundary by `handlers.observability.instrumented`).
TRANSIENT_STEP_ERROR = "Transient"
# Errors a Lambda invocation can raise that say nothing about our code: the call is worth
# repeating as is; and the steps' own transient failures.
TRANSIENT_LAMBDA_ERRORS = [
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.TooManyRequestsException",
    "Lambda.ClientExecutionTimeoutException",
    "Lambda.Unknown",
    # a shard that outlives its Lambda resumes from its checkpoints on the retry
    "Sandbox.Timedout",
    TRANSIENT_STEP_ERROR,
]


def _invoke(placeholder: str, payload: dict[str, Any] | None, next_state: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"FunctionName": "${" + placeholder + "}"}
    if payload is None:
        params["Payload.$"] = "$"
    else:
        params["Payload"] = payload
    state: dict[str, Any] = {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke",
        "Parameters": params,
        "OutputPath": "$.Payload",
        "Retry": [
            {
                "ErrorEquals": TRANSIENT_LAMBDA_ERRORS,
                "IntervalSeconds": 2,
                "MaxAttempts": 6,
                "BackoffRate": 2.0,
                "MaxDelaySeconds": 60,
                "JitterStrategy": "FULL",
            }
        ],
    }
    if next_state is None:
        state["End"] = True
    else:
        state["Next"] = next_state
    return state


def _await(next_state: str) -> dict[str, Any]:
    """Sleep until a webhook (or the Lambda itself) returns the task token, or time out and poll.

    Webhooks only make this faster: on timeout the next state reconciles by polling.
    """
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
        "Parameters": {
            "FunctionName": "${" + FUNCTION_PLACEHOLDERS["await_shard"] + "}",
            "Payload": {"shard.$": "$", "token.$": "$$.Task.Token"},
        },
        "TimeoutSecondsPath": "$.wait_seconds",
        "ResultPath": None,
        "Retry": [
            {
                "ErrorEquals": TRANSIENT_LAMBDA_ERRORS,
                "IntervalSeconds": 2,
                "MaxAttempts": 6,
                "BackoffRate": 2.0,
                "JitterStrategy": "FULL",
            }
        ],
        "Catch": [{"ErrorEquals": ["States.Timeout"], "ResultPath": None, "Next": next_state}],
        "Next": next_state,
    }


def _shard_states() -> dict[str, Any]:
    """The child workflow every shard runs: one branch per mode, each a loop until done."""
    p = FUNCTION_PLACEHOLDERS
    return {
        "StartAt": "Which mode?",
        "States": {
            "Which mode?": {
                "Type": "Choice",
                "Choices": [
                    {"Variable": "$.mode", "StringEquals": "background", "Next": "Submit"},
                    {"Variable": "$.mode", "StringEquals": "batch", "Next": "SubmitBatch"},
                ],
                "Default": "RunShard",
            },
            "RunShard": _invoke(p["run_shard"], None, "Shard done?"),
            "Shard done?": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.done", "BooleanEquals": True, "Next": "Shard finished"}],
                "Default": "RunShard",
            },
            "Submit": _invoke(p["submit"], None, "Submitted?"),
            "Submitted?": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.submitted", "BooleanEquals": True, "Next": "AwaitWebhooks"}],
                "Default": "Submit",
            },
            "AwaitWebhooks": _await("Collect"),
            "Collect": _invoke(p["collect"], None, "Collected?"),
            "Collected?": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.done", "BooleanEquals": True, "Next": "Shard finished"}],
                "Default": "AwaitWebhooks",
            },
            "SubmitBatch": _invoke(p["submit_batch"], None, "AwaitBatch"),
            "AwaitBatch": _await("CollectBatch"),
            "CollectBatch": _invoke(p["collect_batch"], None, "Batch finished?"),
            "Batch finished?": {
                "Type": "Choice",
                "Choices": [
                    {"Variable": "$.done", "BooleanEquals": True, "Next": "Shard finished"},
                    # rows the batch did not finish go through the fan-out engine, if the job allows
                    {"Variable": "$.fallback", "BooleanEquals": True, "Next": "RunShard"},
                ],
                "Default": "AwaitBatch",
            },
            # The Distributed Map gathers every child's output into its own, which Step Functions
            # caps at 256 KiB even with ResultPath null: a child ends with one boolean (5 bytes
            # with its comma; about 52,000 shards), not with its state (~450 bytes; ~580 shards).
            # (a Pass state: cfn-lint's schema allows no OutputPath on Succeed)
            "Shard finished": {"Type": "Pass", "OutputPath": "$.done", "End": True},
        },
    }


def definition() -> dict[str, Any]:
    p = FUNCTION_PLACEHOLDERS
    catch_all = [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "MarkFailed"}]

    plan = _invoke(p["plan"], {"event.$": "$", "execution.$": "$$.Execution.Id"}, "Already seen?")
    plan["Catch"] = catch_all

    shards: dict[str, Any] = {
        "Type": "Map",
        "ItemReader": {
            "Resource": "arn:aws:states:::s3:getObject",
            "ReaderConfig": {"InputType": "JSON"},
            "Parameters": {"Bucket.$": "$.bucket", "Key.$": "$.manifest_key"},
        },
        "ItemProcessor": {
            "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
            **_shard_states(),
        },
        "MaxConcurrencyPath": "$.map_concurrency",
        # a shard that fails after its retries fails the job; moto wants the number as a float
        "ToleratedFailurePercentage": 0.0,
        "Label": "Shards",
        "ResultPath": None,
        "Next": "Merge",
        "Catch": catch_all,
    }

    merge = _invoke(p["merge"], None, "Notify")
    merge["Catch"] = catch_all

    notify = _invoke(p["notify"], None, None)

    mark_failed = _invoke(p["mark_failed"], None, "Job failed")

    return {
        "Comment": "Sluice: one execution per input object; Plan, run every shard, Merge, Notify.",
        "StartAt": "Plan",
        "States": {
            "Plan": plan,
            "Already seen?": {
                "Type": "Choice",
                "Choices": [{"Variable": "$.duplicate", "BooleanEquals": True, "Next": "Skip duplicate"}],
                "Default": "Shards",
            },
            "Skip duplicate": {"Type": "Succeed"},
            "Shards": shards,
            "Merge": merge,
            "Notify": notify,
            "MarkFailed": mark_failed,
            "Job failed": {"Type": "Fail", "Error": "JobFailed", "Cause": "See the job's errors file."},
        },
    }


def definition_json() -> str:
    return json.dumps(definition(), indent=1, sort_keys=True)


def substitute(document: str, values: dict[str, str]) -> str:
    """Replace `${Name}` placeholders the way CloudFormation's DefinitionSubstitutions does."""
    for name, value in values.items():
        document = document.replace("${" + name + "}", value)
    return document
