"""The local cloud patches moto's internals: on a moto it was not written for it must say so."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import boto3
import moto
import pytest
from moto import mock_aws

from sluice_local import moto_patches


def test_the_installed_moto_is_the_one_the_patches_were_written_for() -> None:
    assert moto.__version__ == moto_patches.WRITTEN_FOR, (
        f"moto {moto.__version__} is installed; sluice_local/moto_patches.py was written for moto "
        f"{moto_patches.WRITTEN_FOR}: check every patch against the new moto before changing WRITTEN_FOR"
    )


def test_another_moto_is_refused_with_what_to_do() -> None:
    with pytest.raises(moto_patches.UnsupportedMoto) as refused:
        moto_patches.check_version("5.3.0")
    message = str(refused.value)
    assert "moto 5.2.5" in message and "moto 5.3.0 is installed" in message
    assert "pip install -r requirements.txt" in message


def test_a_local_cloud_on_another_moto_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_local.cloud import LocalCloud

    monkeypatch.setattr(moto, "__version__", "6.0.0")
    cloud = LocalCloud(provider_base_url="http://127.0.0.1:9", api_key="sk-test")
    with pytest.raises(moto_patches.UnsupportedMoto, match=r"moto 6\.0\.0 is installed"), cloud.running():
        pass


def test_an_execution_stopped_while_its_task_runs_ends_aborted_when_the_task_then_fails() -> None:
    """On AWS StopExecution is final: the task running then may fail after it (a shard step cut
    short by Ctrl-C), and the execution still ends ABORTED, as a cancelled job's must."""
    definition = {
        "StartAt": "Work",
        "States": {
            "Work": {
                "Type": "Task",
                "Resource": "arn:aws:states:::lambda:invoke",
                "Parameters": {"FunctionName": "arn:aws:lambda:us-east-1:123456789012:function:work"},
                "End": True,
            }
        },
    }
    started = threading.Event()
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), moto_patches.consistent():
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        machine = sfn.create_state_machine(
            name="stopped", definition=json.dumps(definition), roleArn="arn:aws:iam::123456789012:role/workflow"
        )["stateMachineArn"]
        execution = ""

        def stopped_then_failed(parameters: dict[str, Any], region: str, state_credentials: Any) -> dict[str, Any]:
            started.wait(10)
            sfn.stop_execution(executionArn=execution, error="Sluice.Cancelled", cause="interrupted")
            return {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": {"errorType": "RunInterrupted"}}

        with moto_patches.routed(stopped_then_failed, boto3.Session()):
            execution = sfn.start_execution(stateMachineArn=machine)["executionArn"]
            started.set()
            deadline = time.monotonic() + 10
            while (status := sfn.describe_execution(executionArn=execution)["status"]) == "RUNNING":
                assert time.monotonic() < deadline, "the stopped execution never ended"
                time.sleep(0.02)

    assert status == "ABORTED"
