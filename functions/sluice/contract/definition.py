"""The Amazon States Language definition of a Sluice job.

Kept as plain data (no CDK import) so that the deployed state machine and the local runner
execute the very same document: the CDK stack passes it to `DefinitionBody.from_string`
with `definition_substitutions` for the function ARNs, and `sluice_local/` substitutes the ARNs
of the in-process functions.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.contract import (
    MARK_FAILED_ERROR_KEY,
    PLAN_EVENT_KEY,
    PLAN_EXECUTION_KEY,
    SHARD_FAILED_STEP,
    SHARD_KEY,
    STEP_ERROR_KEY,
    STEPS,
    TASK_TOKEN_KEY,
    BatchCollected,
    BatchSubmitted,
    Collected,
    DirectRun,
    MarkedFailed,
    Merged,
    Mode,
    Planned,
    ShardSpec,
    SlotTaken,
    StepResult,
    Submitted,
)

# One placeholder per Lambda step; the values are function ARNs.
FUNCTION_PLACEHOLDERS = {name: step.placeholder for name, step in STEPS.items()}
# where a Map child's state keeps its shard
SHARD = f"$.{SHARD_KEY}"

# The errorType a step fails with when an AWS call inside it was throttled or failed on the
# service's side after the SDK's own retries (`sluice.core.aws_errors.Transient`, turned so at the
# handler boundary by `sluice_handlers.observability.instrumented`).
TRANSIENT_STEP_ERROR = "Transient"
# A Lambda invocation timed out: a shard that outlives its Lambda resumes from its checkpoints
# on the retry.
LAMBDA_TIMEOUT = "Sandbox.Timedout"
# Errors a Lambda invocation can raise that say nothing about our code: the call is worth
# repeating as is; and the steps' own transient failures.
TRANSIENT_LAMBDA_ERRORS = [
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.ClientExecutionTimeoutException",
    "Lambda.Unknown",
    LAMBDA_TIMEOUT,
    TRANSIENT_STEP_ERROR,
]
TRANSIENT_RETRY = {"IntervalSeconds": 2, "MaxAttempts": 6, "BackoffRate": 2.0, "MaxDelaySeconds": 60}
# Lambda refuses an invocation while the function's reserved concurrency (or the account's) is
# taken: a shard waits for other jobs' shards to end rather than fail its job. The waits climb to
# 2 minutes and stay there: 40 of them, up to 73 minutes in all, 36 on average with the full
# jitter that spreads the waiting shards out. Each refused attempt is 3 history events
# (TaskScheduled, TaskStarted, TaskFailed): at most 123 for a whole wait, of a child's 25,000.
THROTTLED_LAMBDA_ERRORS = ["Lambda.TooManyRequestsException"]
THROTTLE_RETRY = {"IntervalSeconds": 5, "MaxAttempts": 40, "BackoffRate": 2.0, "MaxDelaySeconds": 120}


def _retry(transient: list[str]) -> list[dict[str, Any]]:
    """A Lambda step's Retry: throttling first (its own, longer run of attempts), then `transient`."""
    return [
        {"ErrorEquals": THROTTLED_LAMBDA_ERRORS, **THROTTLE_RETRY, "JitterStrategy": "FULL"},
        {"ErrorEquals": transient, **TRANSIENT_RETRY, "JitterStrategy": "FULL"},
    ]


def _invoke(
    placeholder: str,
    payload: str | dict[str, Any],
    result: type[StepResult] | None,
    next_state: str | None,
    *,
    transient: list[str] = TRANSIENT_LAMBDA_ERRORS,
) -> dict[str, Any]:
    """A Lambda step: `payload` is a path into the state or a Parameters object; the step's typed
    `result` goes to its own place in the state (`$.<KEY>`), or nowhere when None. `transient`:
    the errors it retries as they are."""
    params: dict[str, Any] = {"FunctionName": "${" + placeholder + "}"}
    if isinstance(payload, str):
        params["Payload.$"] = payload
    else:
        params["Payload"] = payload
    state: dict[str, Any] = {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke",
        "Parameters": params,
        "Retry": _retry(transient),
    }
    if result is None:
        state["ResultPath"] = None
    else:
        state["ResultSelector"] = result.selector()
        state["ResultPath"] = f"$.{result.KEY}"
    if next_state is None:
        state["End"] = True
    else:
        state["Next"] = next_state
    return state


def _await(wait_seconds: str, next_state: str) -> dict[str, Any]:
    """Sleep until a webhook (or the Lambda itself) returns the task token, or time out and poll.

    Webhooks only make this faster: on timeout the next state reconciles by polling.
    """
    return {
        "Type": "Task",
        "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
        "Parameters": {
            "FunctionName": "${" + FUNCTION_PLACEHOLDERS["await_shard"] + "}",
            "Payload": {f"{SHARD_KEY}.$": SHARD, f"{TASK_TOKEN_KEY}.$": "$$.Task.Token"},
        },
        "TimeoutSecondsPath": wait_seconds,
        "ResultPath": None,
        "Retry": _retry(TRANSIENT_LAMBDA_ERRORS),
        "Catch": [{"ErrorEquals": ["States.Timeout"], "ResultPath": None, "Next": next_state}],
        "Next": next_state,
    }


def _is_true(path: str, next_state: str) -> dict[str, Any]:
    return {"Variable": path, "BooleanEquals": True, "Next": next_state}


def _if_true(path: str, then: str, otherwise: str) -> dict[str, Any]:
    """A Choice: to `then` when `path` is true, else to `otherwise`."""
    return {"Type": "Choice", "Choices": [_is_true(path, then)], "Default": otherwise}


# A shard step that failed after its retries ends its shard, not its job: ShardFailed cancels the
# shard's open work and writes its unfinished lines to the errors, naming the cause, and the Map's
# other children run on. Only ShardFailed's own failure fails the Map, and with it the job.
SHARD_CATCH = [{"ErrorEquals": ["States.ALL"], "ResultPath": f"$.{STEP_ERROR_KEY}", "Next": "ShardFailed"}]


def _caught(state: dict[str, Any]) -> dict[str, Any]:
    """`state` with SHARD_CATCH after the catches it has."""
    return {**state, "Catch": [*state.get("Catch", []), *SHARD_CATCH]}


def _shard_states() -> dict[str, Any]:
    """The child workflow every shard runs: one branch per mode, each a loop until done.

    Its state is a `ShardState`: the shard as Plan wrote it under `$.shard`, and each step's
    result under its own key, so that no step's answer overwrites the shard or another's.
    """
    p = FUNCTION_PLACEHOLDERS
    states = _mode_states()
    for name, state in states.items():
        if state["Type"] == "Task":
            states[name] = _caught(state)
    states["ShardFailed"] = _invoke(p[SHARD_FAILED_STEP], "$", None, "Give the slot back")
    # whatever ends a shard that ran, its slot goes back; a give-back that fails even so ends the
    # shard all the same, and its slot lapses (`sluice.limits.shard_slots`)
    give_back = _invoke(p["give_back_slot"], {f"{SHARD_KEY}.$": SHARD}, None, "Shard finished")
    give_back["Catch"] = [{"ErrorEquals": ["States.ALL"], "ResultPath": None, "Next": "Shard finished"}]
    states["Give the slot back"] = give_back
    return {"StartAt": "Answered from the cache?", "States": states}


def _mode_states() -> dict[str, Any]:
    p = FUNCTION_PLACEHOLDERS
    return {
        # Plan wrote the outputs of a shard the response cache answered whole: nothing to run
        "Answered from the cache?": _if_true(ShardSpec.path("answered"), "Shard finished", "Take a slot"),
        # one of the environment's shards in flight across all its jobs, waited for in the
        # workflow (no Lambda runs meanwhile) while other jobs' shards hold them all
        "Take a slot": _invoke(p["take_slot"], "$", SlotTaken, "Slot taken?"),
        "Slot taken?": _if_true(SlotTaken.path("taken"), "Which mode?", "Wait for a slot"),
        "Wait for a slot": {"Type": "Wait", "SecondsPath": SlotTaken.path("wait_seconds"), "Next": "Take a slot"},
        "Which mode?": {
            "Type": "Choice",
            "Choices": [
                {"Variable": ShardSpec.path("mode"), "StringEquals": Mode.BACKGROUND, "Next": "Submit"},
                {"Variable": ShardSpec.path("mode"), "StringEquals": Mode.BATCH, "Next": "SubmitBatch"},
            ],
            "Default": "RunShard",
        },
        "RunShard": _invoke(p["run_shard"], "$", DirectRun, "Shard done?"),
        "Shard done?": _if_true(DirectRun.path("done"), "Give the slot back", "RunShard"),
        "Submit": _invoke(p["submit"], "$", Submitted, "Submitted?"),
        "Submitted?": _if_true(Submitted.path("submitted"), "AwaitWebhooks (first)", "Submit"),
        # two waits, one per step whose result says how long: the state keeps both results
        "AwaitWebhooks (first)": _await(Submitted.path("wait_seconds"), "Collect"),
        "Collect": _invoke(p["collect"], "$", Collected, "Collected?"),
        "Collected?": _if_true(Collected.path("done"), "Give the slot back", "AwaitWebhooks"),
        "AwaitWebhooks": _await(Collected.path("wait_seconds"), "Collect"),
        "SubmitBatch": _invoke(p["submit_batch"], "$", BatchSubmitted, "AwaitBatch (first)"),
        "AwaitBatch (first)": _await(BatchSubmitted.path("wait_seconds"), "CollectBatch"),
        "CollectBatch": _invoke(p["collect_batch"], "$", BatchCollected, "Batch finished?"),
        "Batch finished?": {
            "Type": "Choice",
            "Choices": [
                _is_true(BatchCollected.path("done"), "Give the slot back"),
                # rows the batch did not finish go through the fan-out engine, if the job allows
                _is_true(BatchCollected.path("fallback"), "RunShard"),
            ],
            "Default": "AwaitBatch",
        },
        "AwaitBatch": _await(BatchCollected.path("wait_seconds"), "CollectBatch"),
        # The Distributed Map gathers every child's output into its own, which Step Functions
        # caps at 256 KiB even with ResultPath null: a child ends with one boolean (5 bytes
        # with its comma; about 52,000 shards), not with its state (~450 bytes; ~580 shards).
        # Only a finished shard gets here, so the boolean is `true`.
        "Shard finished": {"Type": "Pass", "Result": True, "End": True},
    }


def definition() -> dict[str, Any]:
    p = FUNCTION_PLACEHOLDERS
    catch_all = [{"ErrorEquals": ["States.ALL"], "ResultPath": f"$.{STEP_ERROR_KEY}", "Next": "MarkFailed"}]

    payload = {f"{PLAN_EVENT_KEY}.$": "$", f"{PLAN_EXECUTION_KEY}.$": "$$.Execution.Id"}
    plan = _invoke(p["plan"], payload, Planned, "Already seen?")
    plan["Catch"] = catch_all

    shards: dict[str, Any] = {
        "Type": "Map",
        "ItemReader": {
            "Resource": "arn:aws:states:::s3:getObject",
            "ReaderConfig": {"InputType": "JSON"},
            "Parameters": {"Bucket.$": Planned.path("bucket"), "Key.$": Planned.path("manifest_key")},
        },
        # each child starts as a ShardState holding its manifest item
        "ItemSelector": {f"{SHARD_KEY}.$": "$$.Map.Item.Value"},
        "ItemProcessor": {
            "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
            **_shard_states(),
        },
        "MaxConcurrencyPath": Planned.path("map_concurrency"),
        # a shard that failed ended through ShardFailed; a child that fails even so fails the job
        # (moto wants the number as a float)
        "ToleratedFailurePercentage": 0.0,
        "Label": "Shards",
        "ResultPath": None,
        "Next": "Merge",
        "Catch": catch_all,
    }

    merge = _invoke(p["merge"], {f"{Planned.KEY}.$": f"$.{Planned.KEY}"}, Merged, "Notify")
    merge["Catch"] = catch_all

    # the execution's output is how the job ended, as Notify announced it
    notify = _invoke(p["notify"], f"$.{Merged.KEY}", None, None)
    notify["OutputPath"] = f"$.{Merged.KEY}"

    # MarkFailed reads the plan if there is one, else the S3 event the execution started with. It
    # assembles the shards that never finished for part of its time and runs again for the rest;
    # a timeout would come back on a retry, so it goes to the Catch. Whatever fails it, the job
    # still ends FAILED, every line accounted for from the input alone, with its summary and event.
    mark_failed = _invoke(
        p["mark_failed"],
        "$",
        MarkedFailed,
        "Every line accounted for?",
        transient=[e for e in TRANSIENT_LAMBDA_ERRORS if e != LAMBDA_TIMEOUT],
    )
    mark_failed["Catch"] = [
        {
            "ErrorEquals": ["States.ALL"],
            "ResultPath": f"$.{MARK_FAILED_ERROR_KEY}",
            "Next": "MarkFailed (from the input)",
        }
    ]

    return {
        "Comment": "Sluice: one execution per input object; Plan, run every shard, Merge, Notify.",
        "StartAt": "Plan",
        "States": {
            "Plan": plan,
            "Already seen?": _if_true(Planned.path("duplicate"), "Skip duplicate", "Shards"),
            # the execution's output says which job it was (a Pass: cfn-lint allows no OutputPath on Succeed)
            "Skip duplicate": {"Type": "Pass", "OutputPath": f"$.{Planned.KEY}", "End": True},
            "Shards": shards,
            "Merge": merge,
            "Notify": notify,
            "MarkFailed": mark_failed,
            "Every line accounted for?": {
                "Type": "Choice",
                "Choices": [
                    _is_true(MarkedFailed.path("refused"), "Job refused"),
                    _is_true(MarkedFailed.path("done"), "Job failed"),
                ],
                "Default": "MarkFailed",
            },
            "MarkFailed (from the input)": _invoke(p["mark_failed"], "$", None, "Job failed"),
            "Job failed": {"Type": "Fail", "Error": "JobFailed", "Cause": "See the job's errors file."},
            # Plan refused what the user asked for: the job is FAILED (its summary and event say
            # why), but the execution succeeds, so the ExecutionsFailed alarm counts only failures
            # that are ours; MarkFailed counts the refusal (JobsRefused). The output is the refusal.
            "Job refused": {"Type": "Pass", "OutputPath": f"$.{STEP_ERROR_KEY}", "End": True},
        },
    }


def definition_json() -> str:
    return json.dumps(definition(), indent=1, sort_keys=True)


def substitute(document: str, values: dict[str, str]) -> str:
    """Replace `${Name}` placeholders the way CloudFormation's DefinitionSubstitutions does."""
    for name, value in values.items():
        document = document.replace("${" + name + "}", value)
    return document
