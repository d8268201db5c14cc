"""`sluice` driven as a user would: a subprocess with real arguments.

Deployed commands talk to moto in server mode (a real HTTP endpoint, as AWS would be) holding
the resources a deployed stack has, found through a CloudFormation stack `Sluice-dev` with the
same outputs. The job state they read is made by the real core (plan, shards, merge) running
in this process against the same server, with the simulator as the provider.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import boto3
import orjson
import pytest

from tests.conftest import request_line, write_jsonl
from tests.e2e.helpers.cli import BUCKET, REGION, ROOT, Deployed, clean_env, errors_of, sluice
from tests.e2e.helpers.cli import deployed as deployed
from tests.e2e.helpers.cli import moto_endpoint as moto_endpoint


class Tags(HTMLParser):
    """Every start tag with its attributes, to count bars the way a browser would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def count(self, tag: str, css: str) -> int:
        return sum(1 for t, a in self.tags if t == tag and css in (a.get("class") or "").split())


def parse_html(path: Path) -> Tags:
    tags = Tags()
    tags.feed(path.read_text(encoding="utf-8"))
    return tags


def test_run_writes_the_outputs_and_a_report_linked_from_the_last_line(tmp_path: Path) -> None:
    lines = [request_line(f"r-{n}") for n in range(30)]
    lines[4] = b'{"custom_id": "r-4", "method": "POST",\n'
    path = write_jsonl(tmp_path / "local.jsonl", lines)
    out = tmp_path / "out"
    # the one bad line is allowed in, and within the job's allowance, so it SUCCEEDED
    args = ("--shard-lines", "10", "--latency", "0.01", "--allow-invalid", "--max-error-rate", "0.05")
    done = sluice("run", str(path), "--out", str(out), *args, env=clean_env())

    assert done.returncode == 0, done.stderr
    assert "SIMULATOR" in done.stderr and "SUCCEEDED" in done.stderr
    last = done.stdout.strip().splitlines()[-1]
    report = out / "local.report.html"
    assert last == f"report: {report.resolve().as_uri()}"
    summary = orjson.loads((out / "local.summary.json").read_bytes())
    assert summary["counts"]["results"] == 29 and summary["counts"]["errors"] == 1
    tags = parse_html(report)
    assert tags.count("rect", "bar") == len(summary["latency_histogram"]) > 0
    assert tags.count("rect", "rate") >= 1
    assert len((out / "local.results.jsonl").read_bytes().splitlines()) == 29

    outputs = [str(out / f"local.{kind}.jsonl") for kind in ("results", "errors")]
    verified = sluice("verify", str(path), *outputs, "--summary", str(out / "local.summary.json"), env=clean_env())
    assert verified.returncode == 0 and verified.stdout.startswith("OK: 30 input lines"), verified.stdout
    broken = sluice("verify", str(path), outputs[0], str(write_jsonl(tmp_path / "none.jsonl", [])), env=clean_env())
    assert broken.returncode == 1 and "input line 5 (None) is in neither results nor errors" in broken.stdout


def test_a_runs_time_is_the_whole_commands_as_time_counts_it(tmp_path: Path) -> None:
    """It said 7.3 s while `time` said 11.1 s: the interpreter's start, and its second of tearing
    down the local cloud's objects after the last line, went uncounted."""
    path = write_jsonl(tmp_path / "timed.jsonl", [request_line(f"t-{n}") for n in range(5)])
    began = time.monotonic()
    done = sluice("run", str(path), "--out", str(tmp_path / "out"), "--quiet", "--latency", "0.01", env=clean_env())
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    said = float(re.findall(r"\(([\d.]+) s with the local cloud\)", done.stderr)[0])
    # what is left: the report's writing and the process's own exit
    assert said <= wall + 0.05 and wall - said < 0.75, (said, wall)


def test_the_process_start_is_when_the_command_began() -> None:
    code = (
        "import time; time.sleep(0.5); from sluice_local.cli.app import process_started; "
        "print(time.monotonic() - process_started())"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert 0.5 <= float(done.stdout) < 5


def test_simulator_serves_until_stopped() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice_local.cli", "simulator", "--port", "0", "--latency", "0"],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "simulator listening on http://127.0.0.1:" in first
        base = first.split("listening on ", 1)[1].strip().removesuffix("/v1")
        with urllib.request.urlopen(f"{base}/sim/health", timeout=10) as answer:
            assert answer.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_estimate_counts_requests_and_prices_direct_and_batch(tmp_path: Path) -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 5}
    lines = [
        orjson.dumps({"custom_id": f"e-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}) + b"\n"
        for n in range(10)
    ]
    path = write_jsonl(tmp_path / "est.jsonl", [*lines, b"\n"])
    done = sluice("estimate", str(path), "--json", env=clean_env())

    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["requests"], data["lines"], data["blank"]) == (10, 11, 1)
    model = data["models"]["gpt-4o-mini"]
    assert model["output_tokens"] == 50 and model["input_tokens"] == 10 * (100 + 4)
    assert model["batch_usd"] == pytest.approx(model["direct_usd"] / 2, rel=1e-3)
    assert data["provider_usd"]["batch"] < data["provider_usd"]["direct"] and data["aws_usd"] > 0

    text = sluice("estimate", str(path), "--model", "gpt-4o", env=clean_env())
    assert text.returncode == 0 and "gpt-4o " in text.stdout and "batch" in text.stdout


def test_bad_input_says_where_and_exits_3(tmp_path: Path) -> None:
    env = clean_env()
    missing = sluice("estimate", str(tmp_path / "nope.jsonl"), env=env)
    assert missing.returncode == 3 and f"no such file: {tmp_path / 'nope.jsonl'}" in missing.stderr

    lines = [request_line("a"), b'{"custom_id": "b", "method": "POST",\n', request_line("c"), request_line("a")]
    bad = write_jsonl(tmp_path / "bad.jsonl", lines)
    # submit checks the file before it needs AWS: no credentials are set here
    done = sluice("submit", str(bad), "--env", "dev", env=env)
    assert done.returncode == 3
    assert "2 invalid line(s) of 4" in done.stderr
    assert "line 2, column 37: not JSON: it ends before the JSON does (cut short?)" in done.stderr
    assert "line 4: duplicate custom_id 'a' (first on line 1)" in done.stderr
    assert done.stdout == ""

    option = sluice(
        "submit", str(write_jsonl(tmp_path / "ok.jsonl", [request_line("a")])), "--mode", "sideways", env=env
    )
    assert option.returncode == 2 and "argument --mode: invalid choice: 'sideways'" in option.stderr


def test_without_aws_credentials_exits_5(tmp_path: Path) -> None:
    env = clean_env(
        AWS_DEFAULT_REGION=REGION,
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    done = sluice("status", "--env", "dev", env=env)
    assert done.returncode == 5 and "no AWS credentials" in done.stderr


def test_environment_and_job_errors_have_their_own_exit_codes(deployed: Deployed, tmp_path: Path) -> None:
    ok = write_jsonl(tmp_path / "ok.jsonl", [request_line("a")])
    unknown = sluice("submit", str(ok), "--env", "nope", env=deployed.env)
    assert unknown.returncode == 4
    assert "unknown environment 'nope': no stack Sluice-nope in us-east-1 (deployed here: dev" in unknown.stderr

    missing = deployed.cli("status", "no-such-job-0123")
    assert missing.returncode == 6 and "no job 'no-such-job-0123' in Sluice-dev" in missing.stderr
    assert deployed.cli("results", "no-such-job-0123").returncode == 6
    assert deployed.cli("cancel", "no-such-job-0123").returncode == 6

    empty = deployed.cli("status")
    assert empty.returncode == 0 and "no jobs yet in Sluice-dev" in empty.stderr

    from sluice_local.console import EXIT_ENVIRONMENT, CliError
    from sluice_local.deployed import connect
    from sluice_local.deployed.stack import REQUIRED_OUTPUTS

    # the provider the stack's functions call: the stack has no output for it
    assert connect("dev").provider_base_url() == deployed.sim.base_url
    bare = {
        "Resources": {"Bucket": {"Type": "AWS::S3::Bucket"}},
        "Outputs": {name: {"Value": "-"} for name in REQUIRED_OUTPUTS},
    }
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName="Sluice-bare", TemplateBody=json.dumps(bare)
    )
    with pytest.raises(CliError, match="cannot tell which provider Sluice-bare uses") as refused:
        connect("bare").provider_base_url()
    assert refused.value.code == EXIT_ENVIRONMENT


def test_submit_then_status_while_running_then_results(deployed: Deployed, tmp_path: Path) -> None:
    from sluice.plan.plan import job_id_for

    path = write_jsonl(
        tmp_path / "reviews.jsonl", [request_line(f"c-{n}", "great" if n % 2 else "awful") for n in range(25)]
    )
    submitted = deployed.cli("submit", str(path), "--mode", "direct", "--concurrency", "20", "--quiet")

    assert submitted.returncode == 0, submitted.stderr
    head = deployed.s3.head_object(Bucket=BUCKET, Key="inbox/reviews.jsonl")
    job_id = submitted.stdout.strip()
    assert job_id == job_id_for(BUCKET, "inbox/reviews.jsonl", head["ETag"])
    assert head["Metadata"] == {"sluice-mode": "direct", "sluice-concurrency": "20"}

    state = deployed.start("inbox/reviews.jsonl")
    first, *rest = deployed.specs(state)
    deployed.run_shard(first)

    running = deployed.cli("status", job_id)
    assert running.returncode == 0, running.stderr
    assert f"job {job_id}  RUNNING" in running.stdout
    assert "lines 25: done 10 · failed 0 · pending 15  [40%]" in running.stdout
    assert "shards: 1 DONE, 2 PENDING" in running.stdout and "ETA" in running.stdout
    not_yet = deployed.cli("results", job_id)
    assert not_yet.returncode == 7 and "is RUNNING" in not_yet.stderr

    # --watch follows the job while the rest of it runs, and exits with how it ended
    watcher = subprocess.Popen(
        [sys.executable, "-m", "sluice_local.cli", "status", job_id, "--env", "dev", "--watch", "--interval", "0.2"],
        cwd=ROOT,
        env=deployed.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for spec in rest:
        deployed.run_shard(spec)
    deployed.merge(state)
    out_text, err_text = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err_text
    assert f"job {job_id}  SUCCEEDED" in out_text and "done 25 · failed 0 · pending 0" in out_text

    listing = deployed.cli("status")
    assert listing.returncode == 0
    row = next(line for line in listing.stdout.splitlines() if line.startswith(job_id))
    assert "SUCCEEDED" in row and "inbox/reviews.jsonl" in row

    item = deployed.cli("status", job_id, "--item", "c-17")
    assert item.returncode == 0, item.stderr
    # a direct-mode success has no item row: its state comes from the shard's checkpoint
    assert "request 'c-17' of job" in item.stdout and "(line 18, shard 1)" in item.stdout
    assert "state       done (HTTP 200)" in item.stdout and "provider id chatcmpl-" in item.stdout
    assert deployed.cli("status", job_id, "--item", "c-999").returncode == 6

    out = tmp_path / "out"
    fetched = deployed.cli("results", job_id, "--out", str(out))
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout.strip().splitlines()[-1] == f"report: {(out / 'reviews.report.html').resolve().as_uri()}"
    results = [orjson.loads(line) for line in (out / "reviews.results.jsonl").read_bytes().splitlines()]
    assert [r["custom_id"] for r in results] == [f"c-{n}" for n in range(25)]
    summary = orjson.loads((out / "reviews.summary.json").read_bytes())
    tags = parse_html(out / "reviews.report.html")
    assert tags.count("rect", "bar") == len(summary["latency_histogram"])


def test_retry_uploads_only_the_failed_lines_with_the_parent_job(deployed: Deployed, tmp_path: Path) -> None:
    deployed.sim.configure(rate_500=0.4)
    lines = [request_line(f"f-{n}") for n in range(20)]
    lines[3] = b'{"custom_id": "f-3", "method": "POST",\n'
    path = write_jsonl(tmp_path / "flaky.jsonl", lines)
    submitted = deployed.cli("submit", str(path), "--max-attempts", "1", "--allow-invalid", "--quiet")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    state = deployed.start("inbox/flaky.jsonl", max_attempts=1)
    for spec in deployed.specs(state):
        deployed.run_shard(spec)
    summary = deployed.merge(state)
    exhausted = summary["errors_by_code"].get("retries_exhausted", 0)
    assert exhausted > 0 and summary["errors_by_code"]["invalid_json"] == 1

    first_failed = next(
        e for e in errors_of(deployed, "outbox/flaky.errors.jsonl") if e["error"]["code"] == "retries_exhausted"
    )
    item = deployed.cli("status", job_id, "--item", first_failed["custom_id"])
    assert item.returncode == 0, item.stderr
    # one attempt in all: a line of one attempt has none left for the shard's last sweep
    assert "state       failed (HTTP 500)" in item.stdout and "attempts    1" in item.stdout
    assert "last error  retries_exhausted: gave up after 1 attempts" in item.stdout
    invalid = deployed.cli("status", job_id, "--item", "f-3", "--input", str(path))
    assert invalid.returncode == 0 and "state       failed" in invalid.stdout and "not JSON" in invalid.stdout

    retried = deployed.cli("retry", job_id, "--quiet")
    assert retried.returncode == 0, retried.stderr
    assert "not retried: 1 line(s) with invalid_json" in retried.stderr
    errors = errors_of(deployed, "outbox/flaky.errors.jsonl")
    failed = [e["line"] for e in errors if e["error"]["code"] == "retries_exhausted"]
    obj = deployed.s3.get_object(Bucket=BUCKET, Key="inbox/flaky.retry-1.jsonl")
    assert obj["Body"].read() == b"".join(lines[n - 1] for n in failed)
    assert obj["Metadata"] == {"sluice-max-attempts": "1", "sluice-parent-job": job_id}
    assert retried.stdout.strip().startswith("flaky-retry-1-")

    again = deployed.cli("retry", job_id, "--code", "invalid_json", "--quiet")
    assert again.returncode == 0, again.stderr
    assert deployed.s3.get_object(Bucket=BUCKET, Key="inbox/flaky.retry-2.jsonl")["Body"].read() == lines[3]


def test_a_job_stopped_by_its_budget_shows_it_and_retries_with_a_higher_budget(
    deployed: Deployed, tmp_path: Path
) -> None:
    lines = [request_line(f"c-{n}") for n in range(20)]
    path = write_jsonl(tmp_path / "capped.jsonl", lines)
    # one line's worst case is about $0.00062 (no max_tokens), an answer about $0.0000025
    submitted = deployed.cli("submit", str(path), "--budget", "0.00065", "--quiet")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    state = deployed.start("inbox/capped.jsonl")
    for spec in deployed.specs(state):
        deployed.run_shard(spec)
    summary = deployed.merge(state)
    assert summary["status"] == "BUDGET_EXCEEDED"
    unsent = summary["errors_by_code"]["budget_exceeded"]
    assert 0 < unsent < 20

    status = deployed.cli("status", job_id)
    assert status.returncode == 0, status.stderr
    # a spend of a few millionths of a dollar shows as one, not as $0.0000
    assert "BUDGET_EXCEEDED" in status.stdout, status.stdout
    assert re.search(r"budget \$0\.00065: spent \$0\.0000\d*[1-9]\d \(", status.stdout), status.stdout
    assert f"`sluice retry {job_id} --budget USD` sends the lines the budget kept back" in status.stdout
    # every line is accounted for in the job's counters: the unsent ones are failed, none pending
    assert f"failed {unsent} · pending 0" in status.stdout

    retried = deployed.cli("retry", job_id, "--budget", "1", "--quiet")
    assert retried.returncode == 0, retried.stderr
    failed = [e["line"] for e in errors_of(deployed, "outbox/capped.errors.jsonl")]
    obj = deployed.s3.get_object(Bucket=BUCKET, Key="inbox/capped.retry-1.jsonl")
    assert obj["Body"].read() == b"".join(lines[n - 1] for n in failed)
    assert obj["Metadata"] == {"sluice-budget-usd": "1.0", "sluice-parent-job": job_id}


def test_cancel_stops_the_execution_cancels_provider_work_and_keeps_what_finished(
    deployed: Deployed, tmp_path: Path
) -> None:
    from openai import OpenAI
    from sluice.runners.background import collect_background, submit_background

    path = write_jsonl(tmp_path / "long.jsonl", [request_line(f"l-{n}", url="/v1/responses") for n in range(20)])
    submitted = deployed.cli("submit", str(path), "--mode", "background", "--quiet")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    state = deployed.start("inbox/long.jsonl")
    done_shard, open_shard = deployed.specs(state)
    ctx = deployed.context()
    asyncio.run(submit_background(ctx, done_shard))
    deadline = time.monotonic() + 10
    while not asyncio.run(collect_background(ctx, done_shard)).done:
        assert time.monotonic() < deadline, "the first shard should settle quickly"
        time.sleep(0.05)
    # the second shard's responses (and a batch of it) are still running when the user cancels
    deployed.sim.configure(latency_s=120, batch_phase_s=120)
    asyncio.run(submit_background(ctx, open_shard))
    client = OpenAI(base_url=deployed.sim.base_url, api_key="sk-test")
    upload = client.files.create(file=("rows.jsonl", request_line("x")), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deployed.store.set_shard_batches(job_id, 1, [batch.id])
    deployed.sim.clear_log()

    cancelled = deployed.cli("cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "execution: stopped" in cancelled.stderr
    assert "1 batch(es) and 10 background response(s) cancelled" in cancelled.stderr
    cancels = Counter(e["path"].rsplit("/", 2)[0] for e in deployed.sim.log if e["path"].endswith("/cancel"))
    assert cancels == Counter({"/v1/responses": 10, "/v1/batches": 1})
    assert client.batches.retrieve(batch.id).status in ("cancelling", "cancelled")

    execution = deployed.sfn.list_executions(stateMachineArn=deployed.state_machine_arn)["executions"][0]
    assert execution["status"] == "ABORTED"
    job = deployed.store.job(job_id)
    assert job is not None and job.status == "CANCELLED"
    read = deployed.s3.get_object
    results = [
        orjson.loads(r) for r in read(Bucket=BUCKET, Key="outbox/long.results.jsonl")["Body"].read().splitlines()
    ]
    errors = [orjson.loads(e) for e in read(Bucket=BUCKET, Key="outbox/long.errors.jsonl")["Body"].read().splitlines()]
    assert [r["custom_id"] for r in results] == [f"l-{n}" for n in range(10)]
    assert [e["custom_id"] for e in errors] == [f"l-{n}" for n in range(10, 20)]
    assert {e["error"]["code"] for e in errors} == {"cancelled"}

    out = tmp_path / "out"
    fetched = deployed.cli("results", job_id, "--out", str(out), "--quiet")
    assert fetched.returncode == 0, fetched.stderr
    assert '<span class="status bad">CANCELLED</span>' in (out / "long.report.html").read_text()

    again = deployed.cli("cancel", job_id)
    assert again.returncode == 0 and "already ended CANCELLED" in again.stderr


def test_submit_refuses_what_the_environments_provider_cannot_run_before_uploading(
    deployed: Deployed, tmp_path: Path
) -> None:
    cfn = boto3.client("cloudformation", region_name=REGION)
    template = json.loads(json.dumps(cfn.get_template(StackName="Sluice-dev")["TemplateBody"]))
    template["Outputs"]["Provider"] = {"Value": "anthropic"}
    cfn.create_stack(StackName="Sluice-claude", TemplateBody=json.dumps(template))
    path = write_jsonl(tmp_path / "claude.jsonl", [request_line("a")])

    background = sluice("submit", str(path), "--env", "claude", "--mode", "background", env=deployed.env)
    assert background.returncode == 2, background.stderr
    assert "sluice-mode=background: the anthropic provider has no background responses" in background.stderr
    named = sluice("submit", str(path), "--env", "claude", "--provider", "openai", env=deployed.env)
    assert named.returncode == 2
    assert "sluice-provider=openai: this environment is configured for the anthropic provider only" in named.stderr
    assert "Traceback" not in background.stderr + named.stderr
    assert deployed.s3.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0) == 0
    # the same file goes to the environment as it is
    fine = sluice("submit", str(path), "--env", "claude", "--provider", "anthropic", "--quiet", env=deployed.env)
    assert fine.returncode == 0, fine.stderr
    (head,) = deployed.s3.list_objects_v2(Bucket=BUCKET)["Contents"]
    assert deployed.s3.head_object(Bucket=BUCKET, Key=head["Key"])["Metadata"] == {"sluice-provider": "anthropic"}
