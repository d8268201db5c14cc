"""The deployed state machine definition, run in moto's interpreter with the real handlers."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import orjson
import pytest

from sluice_local.cloud import run_job
from tests.conftest import request_line, write_jsonl


def test_300_lines_with_5_invalid_ones(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud(shard_lines=100)
    lines = [request_line(f"r-{n}", "great value" if n % 2 else "awful, broken after a day") for n in range(1, 301)]
    lines[9] = b'{"custom_id": "r-10", "method": "POST", \n'
    lines[49] = orjson.dumps({"method": "POST", "url": "/v1/chat/completions", "body": {}}) + b"\n"
    lines[119] = lines[119].replace(b'"POST"', b'"GET"')
    lines[199] = lines[199].replace(b"/v1/chat/completions", b"/v1/images/generations")
    lines[298] = request_line("r-3")
    run = run_job(cloud, write_jsonl(tmp_path / "mixed.jsonl", lines))

    assert run.status == "SUCCEEDED"
    valid = [n for n in range(1, 301) if n not in (10, 50, 120, 200, 299)]
    assert [r["custom_id"] for r in run.results] == [f"r-{n}" for n in valid]
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in run.results)
    assert run.results[0]["response"]["body"]["choices"][0]["message"]["content"] == "positive"
    assert run.results[1]["response"]["body"]["choices"][0]["message"]["content"] == "negative"
    errors = {e["line"]: e["error"] for e in run.errors}
    assert list(errors) == [10, 50, 120, 200, 299]
    assert errors[10]["code"] == "invalid_json" and errors[10]["message"].startswith("line 10, column")
    assert errors[50]["code"] == "missing_custom_id"
    assert errors[120]["code"] == "invalid_method"
    assert errors[200]["code"] == "unsupported_url"
    assert errors[299] == {
        "code": "duplicate_custom_id",
        "message": "line 299: duplicate custom_id 'r-3' (first on line 3)",
    }
    counts = run.summary["counts"]
    assert counts == {"lines": 300, "blank": 0, "requests": 300, "results": 295, "errors": 5}
    assert sum(run.summary["errors_by_code"].values()) == 5
    assert len(run.summary["shards"]) == 3
    assert run.summary["tokens"]["input"] > 0 and run.summary["latency_s"]["p50"] is not None


def test_a_shard_out_of_time_checkpoints_and_resumes_without_resending(make_cloud, simulator, tmp_path: Path) -> None:
    simulator.configure(latency_s=0.1)
    cloud = make_cloud(
        shard_lines=1000, concurrency=8, lambda_timeout_s=3.0, safety_margin_s=0.5, request_timeout_s=1.0
    )
    path = write_jsonl(tmp_path / "slow.jsonl", [request_line(f"s-{n}") for n in range(400)])
    run = run_job(cloud, path)

    assert run.status == "SUCCEEDED"
    runs = [i for i in cloud.invocations if i.step == "run_shard"]
    assert len(runs) >= 2, "the shard should have needed more than one Lambda run"
    assert [r["custom_id"] for r in run.results] == [f"s-{n}" for n in range(400)]
    sent = Counter(entry["custom_id"] for entry in simulator.log if entry["path"] == "/v1/chat/completions")
    assert sent == Counter({f"s-{n}": 1 for n in range(400)})


def test_the_same_object_never_runs_twice_but_new_content_does(make_cloud, tmp_path: Path) -> None:
    cloud = make_cloud()
    path = write_jsonl(tmp_path / "once.jsonl", [request_line(f"o-{n}") for n in range(20)])
    key, etag = cloud.upload(path)
    event = cloud.object_created_event(key, etag)
    first = cloud.wait(cloud.start(event, name="first"))
    again = cloud.wait(cloud.start(event, name="redelivered"))
    assert first["status"] == again["status"] == "SUCCEEDED"
    assert orjson.loads(again["output"])["duplicate"] is True
    assert sum(1 for i in cloud.invocations if i.step == "merge") == 1

    write_jsonl(path, [request_line(f"o-{n}") for n in range(25)])
    rerun = run_job(cloud, path)
    assert rerun.status == "SUCCEEDED" and len(rerun.results) == 25
    assert sum(1 for i in cloud.invocations if i.step == "merge") == 2


def test_a_shard_that_cannot_even_end_alone_marks_the_job_failed_and_still_accounts_for_every_line(
    make_cloud, tmp_path: Path
) -> None:
    cloud = make_cloud(shard_lines=10)

    def break_shard_two(step: str, payload: dict) -> None:
        # the shard fails, and so does the ShardFailed step that would have ended it alone
        if step in ("run_shard", "fail_shard") and payload["shard"]["shard"] == 2:
            raise RuntimeError("disk on fire")

    cloud.before_invoke = break_shard_two
    run = run_job(cloud, write_jsonl(tmp_path / "doomed.jsonl", [request_line(f"d-{n}") for n in range(30)]))

    assert run.status == "FAILED"
    assert run.summary["status"] == "FAILED"
    done = {r["custom_id"] for r in run.results}
    failed = {e["custom_id"]: e["error"] for e in run.errors}
    assert done | set(failed) == {f"d-{n}" for n in range(30)} and not done & set(failed)
    assert {f"d-{n}" for n in range(20, 30)} <= set(failed)
    assert all(err["code"] == "job_failed" for err in failed.values())
    # Step Functions fails the Map on the shard's error (ToleratedFailurePercentage 0, which the
    # local cloud enforces for moto); had the Map gone on, Merge would have found the shard missing
    assert any(
        reason in failed["d-25"]["message"]
        for reason in ("States.ExceedToleratedFailureThreshold", "shard 2 (lines 21-30) did not finish")
    )
    assert [r["custom_id"] for r in run.results] == sorted(done, key=lambda c: int(c.split("-")[1]))


def test_a_bad_option_fails_the_job_with_a_clear_reason_and_pages_nobody(
    make_cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sluice.contract import JOBS_OVER_ERROR_RATE, JOBS_REFUSED

    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "false")
    cloud = make_cloud()
    path = write_jsonl(tmp_path / "opts.jsonl", [request_line("x")])
    run = run_job(cloud, path, metadata={"sluice-mode": "sideways"})
    # the job failed, as its summary says; the execution did not, so ExecutionsFailed stays quiet
    assert run.summary["status"] == "FAILED"
    assert "sluice-mode='sideways'" in run.summary["error"]
    assert run.status == "SUCCEEDED"
    assert orjson.loads(run.execution["output"])["Error"] == "PlanError"
    # and the refusal is counted, once, where a dashboard shows it; no alarm's metric is
    emitted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]
    assert [record.get(JOBS_REFUSED) for record in emitted if JOBS_REFUSED in record] == [[1.0]]
    assert not [record for record in emitted if JOBS_OVER_ERROR_RATE in record]


def test_a_line_that_names_no_model_gets_the_environments_default(make_cloud, simulator, tmp_path: Path) -> None:
    cloud = make_cloud(default_model="sim-default-model")
    unnamed = orjson.loads(request_line("no-model"))
    del unnamed["body"]["model"]
    lines = [orjson.dumps(unnamed) + b"\n", request_line("named")]
    for mode in ("direct", "batch"):
        run = run_job(cloud, write_jsonl(tmp_path / f"{mode}.jsonl", lines), metadata={"sluice-mode": mode})
        assert run.status == "SUCCEEDED", (mode, run.errors)
        models = {r["custom_id"]: r["response"]["body"]["model"] for r in run.results}
        assert models == {"no-model": "sim-default-model", "named": "gpt-4o-mini"}, mode
