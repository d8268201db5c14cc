"""IAM in the local cloud: each step runs as its own role, with the statements synthesized for it."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from sluice_handlers.runtime import session_for

from infra.grants import Grants
from sluice_local import iam
from sluice_local.cloud import REGION, LocalCloud, LocalSettings, function_name, run_job
from sluice_local.simulator import SimulatorServer
from tests.conftest import request_line, write_jsonl


def _denied(call: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return str(caught.value)


def test_each_step_may_do_only_what_its_role_grants(make_cloud) -> None:
    cloud = make_cloud()
    mark_failed = session_for(function_name("mark_failed")).client("s3")
    notify = session_for(function_name("notify"))
    plan = session_for(function_name("plan")).client("s3")

    mark_failed.put_object(Bucket=cloud.bucket, Key="outbox/x.summary.json", Body=b"{}")
    assert "AccessDenied" in _denied(mark_failed.put_object, Bucket=cloud.bucket, Key="inbox/x.jsonl", Body=b"")
    assert "AccessDenied" in _denied(plan.put_object, Bucket=cloud.bucket, Key="outbox/x.results.jsonl", Body=b"")
    secret = _denied(notify.client("secretsmanager").get_secret_value, SecretId=cloud.secret_arn)
    assert "AccessDenied" in secret and "secretsmanager:GetSecretValue" in secret
    # the cloud's own calls run as its admin
    assert boto3.client("s3", region_name=REGION).get_object(Bucket=cloud.bucket, Key="outbox/x.summary.json")


def test_a_failed_job_ends_with_its_errors_file_and_summary_written_by_mark_failed(make_cloud, tmp_path: Path) -> None:
    """MarkFailed finishes the shards that never did, under its own role, then writes the outputs."""
    cloud = make_cloud(shard_lines=10, map_concurrency=1)

    def break_shard_one(step: str, payload: dict) -> None:
        # the shard fails, and so does the ShardFailed step that would have ended it alone
        if step in ("run_shard", "fail_shard") and payload["shard"]["shard"] == 1:
            raise RuntimeError("disk on fire")

    cloud.before_invoke = break_shard_one
    run = run_job(cloud, write_jsonl(tmp_path / "doomed.jsonl", [request_line(f"d-{n}") for n in range(40)]))

    assert run.status == "FAILED"
    marked = [i for i in cloud.invocations if i.step == "mark_failed"]
    assert len(marked) == 1 and marked[0].error is None
    assert not any(i.step == "merge" and i.error is None for i in cloud.invocations)
    assert run.summary["status"] == "FAILED"
    # moto's interpreter lets the Map succeed past a failed child, and Merge finds it
    # the Map fails on the shard's error (ToleratedFailurePercentage 0, enforced by the local cloud)
    reasons = ("disk on fire", "States.ExceedToleratedFailureThreshold", "shard 1 (lines 11-20) did not finish")
    assert any(reason in run.summary["error"] for reason in reasons)
    assert run.summary["counts"]["results"] + run.summary["counts"]["errors"] == 40
    failed = {e["custom_id"]: e["error"] for e in run.errors}
    assert {f"d-{n}" for n in range(10, 20)} <= set(failed)
    assert all(error["code"] == "job_failed" for error in failed.values())
    assert run.verify(tmp_path / "doomed.jsonl").ok


def test_a_grant_removed_from_the_stack_fails_the_local_run_with_access_denied(
    simulator: SimulatorServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Synthesize the stack without Merge's write to outbox/; the local run must be denied it."""
    allow = Grants.allow

    def allow_all_but_merge_writing_outbox(self: Grants, role: object, actions: list[str], *a, **kw) -> None:  # type: ignore[no-untyped-def]
        if role is self.by_step["merge"].role and "s3:PutObject" in actions:
            return
        allow(self, role, actions, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Grants, "allow", allow_all_but_merge_writing_outbox)
    policies = iam.snapshot()
    snapshot = iam.load_policies()
    assert {name for name in snapshot if policies[name] != snapshot[name]} == {"merge"}

    cloud = LocalCloud(
        provider_base_url=simulator.base_url,
        api_key="sk-test",
        settings=LocalSettings(concurrency=20, map_concurrency=2, shard_lines=10, request_timeout_s=5.0),
        policies=policies,
    )
    path = write_jsonl(tmp_path / "denied.jsonl", [request_line(f"g-{n}") for n in range(25)])
    with cloud.running():
        run = run_job(cloud, path)

    assert run.status == "FAILED"
    merged = [i for i in cloud.invocations if i.step == "merge"]
    assert merged and all(i.error and "AccessDenied" in i.error for i in merged)
    # MarkFailed, which may write outbox/, still writes every output, and says why the job failed
    assert run.summary["status"] == "FAILED"
    assert "AccessDenied" in run.summary["error"] and "PutObject" in run.summary["error"]
    assert len(run.results) + len(run.errors) == 25 and run.verify(path).ok
