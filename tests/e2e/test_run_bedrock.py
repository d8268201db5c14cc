"""`sluice run --provider bedrock` as a user types it: on the built-in simulator (Converse) and the
local cloud's emulation of Bedrock's batch inference jobs, in direct, batch and auto mode; and at
the runtime endpoint AWS_ENDPOINT_URL_BEDROCK_RUNTIME names, signed with the user's credentials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from bench.converse_server import ANSWER_PREFIX, InThread
from tests.conftest import request_line, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
MODEL = "anthropic.claude-3-haiku-20240307-v1:0"


def _chat(custom_id: str) -> bytes:
    return request_line(custom_id).replace(b"gpt-4o-mini", MODEL.encode())


def _messages(custom_id: str) -> bytes:
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "I loved it"}]}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/messages", "body": body}) + b"\n"


def _run(path: Path, out: Path, *options: str, **variables: str) -> tuple[subprocess.CompletedProcess[bytes], Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "AWS_"))}
    env.update(PYTHONPATH=f"{ROOT / 'functions'}:{ROOT}", **variables)
    command = [sys.executable, "-m", "sluice_local.cli", "run", str(path), "--provider", "bedrock", "--model", MODEL]
    done = subprocess.run([*command, "--no-cache", *options, "--out", str(out)], cwd=ROOT, env=env, capture_output=True)
    summary = out / f"{path.stem}.summary.json"
    return done, orjson.loads(summary.read_bytes()) if summary.exists() else {}


def _results(out: Path, stem: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / f"{stem}.results.jsonl").read_bytes().splitlines()]


def test_direct_runs_on_the_simulator_when_no_endpoint_is_set(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "direct.jsonl", [_chat(f"d-{n}") for n in range(12)])
    done, summary = _run(path, tmp_path / "out", "--mode", "direct")

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    stderr = done.stderr.decode()
    assert "provider: built-in SIMULATOR" in stderr
    assert summary["status"] == "SUCCEEDED" and summary["counts"]["errors"] == 0
    assert summary["run"]["provider"].startswith("bedrock: built-in simulator")
    assert summary["shards"][0]["paths"] == {"direct": 12}
    bodies = [r["response"]["body"] for r in _results(tmp_path / "out", "direct")]
    assert [b["object"] for b in bodies] == ["chat.completion"] * 12 and {b["model"] for b in bodies} == {MODEL}
    assert summary["cost_estimate_usd"]["provider"] > 0


def test_a_run_goes_to_the_endpoint_boto3_would_signed_with_the_users_credentials(tmp_path: Path) -> None:
    """Issue 42: AWS_ENDPOINT_URL_BEDROCK_RUNTIME is honoured, as boto3 honours it: the requests reach a
    Converse server Sluice's simulator is not, signed with the user's own access key, and its answers
    come back as chat completions."""
    path = write_jsonl(tmp_path / "endpoint.jsonl", [_chat(f"e-{n}") for n in range(12)])
    with InThread(secrets={"AKIDUSERSOWN": "users-secret"}) as server:
        done, summary = _run(
            path,
            tmp_path / "out",
            "--mode",
            "auto",
            AWS_ENDPOINT_URL_BEDROCK_RUNTIME=server.base_url,
            AWS_ACCESS_KEY_ID="AKIDUSERSOWN",
            AWS_SECRET_ACCESS_KEY="users-secret",
            AWS_DEFAULT_REGION="eu-west-3",
        )

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    stderr = done.stderr.decode()
    assert f"provider: bedrock runtime at {server.base_url}" in stderr and "SIMULATOR" not in stderr
    assert "users-secret" not in stderr
    assert server.requests == 12 and server.models == {MODEL: 12}
    assert server.access_keys == {"AKIDUSERSOWN": 12} and server.regions == {"eu-west-3": 12}
    # each signature recomputed by botocore from the request as it arrived, each body valid in AWS's model
    assert server.verified == 12 and not server.refused
    assert summary["status"] == "SUCCEEDED" and summary["run"]["provider"] == f"bedrock: {server.base_url}"
    bodies = [r["response"]["body"] for r in _results(tmp_path / "out", "endpoint")]
    assert [b["object"] for b in bodies] == ["chat.completion"] * 12
    assert all(b["choices"][0]["message"]["content"].startswith(ANSWER_PREFIX) for b in bodies)
    # that server sends no x-amzn-RequestId, as a gateway may not: each answer still has an id of its own
    assert len({b["id"] for b in bodies}) == 12 and all(isinstance(b["id"], str) for b in bodies)


def test_a_signature_the_endpoint_rejects_ends_the_run_as_a_refusal(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "wrong.jsonl", [_chat(f"w-{n}") for n in range(30)])
    with InThread(secrets={"AKIDUSERSOWN": "the-real-secret"}) as server:
        done, summary = _run(
            path, tmp_path / "out", "--mode", "direct", AWS_ENDPOINT_URL_BEDROCK_RUNTIME=server.base_url,
            AWS_ACCESS_KEY_ID="AKIDUSERSOWN", AWS_SECRET_ACCESS_KEY="a-stale-secret",
        )  # fmt: skip
    assert done.returncode == 8, done.stderr.decode()[-2000:]
    assert server.requests == server.verified == 0 and server.refused["signature"] > 0
    assert "a-stale-secret" not in done.stderr.decode()
    assert summary["counts"]["lines"] == 30 and summary["counts"]["results"] + summary["counts"]["errors"] == 30


def test_batch_at_a_users_endpoint_is_refused_and_no_credentials_is_said(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "refused.jsonl", [_chat(f"r-{n}") for n in range(3)])
    done, _ = _run(
        path, tmp_path / "out", "--mode", "batch", AWS_ENDPOINT_URL_BEDROCK_RUNTIME="http://127.0.0.1:9",
        AWS_ACCESS_KEY_ID="AKID", AWS_SECRET_ACCESS_KEY="s",
    )  # fmt: skip
    assert done.returncode == 2 and "--mode batch" in done.stderr.decode()
    home = tmp_path / "home"
    home.mkdir()
    bare = {"HOME": str(home), "AWS_CONFIG_FILE": str(home / "c"), "AWS_SHARED_CREDENTIALS_FILE": str(home / "k")}
    done, _ = _run(path, tmp_path / "out", AWS_ENDPOINT_URL_BEDROCK_RUNTIME="http://127.0.0.1:9", **bare)
    # 5 is "AWS: no credentials"; 4 is an unknown environment, which a local run has none of
    assert done.returncode == 5 and "no AWS credentials were found" in done.stderr.decode()


def test_batch_runs_a_job_of_at_least_a_hundred_records_and_sends_a_smaller_part_direct(tmp_path: Path) -> None:
    # 100 chat lines are one job; 30 Messages lines, a part of their own below Bedrock's minimum, go direct
    lines = [_chat(f"b-{n}") for n in range(100)] + [_messages(f"m-{n}") for n in range(30)]
    path = write_jsonl(tmp_path / "batched.jsonl", lines)
    done, summary = _run(path, tmp_path / "out", "--mode", "batch")

    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert summary["status"] == "SUCCEEDED" and summary["counts"] == {
        "lines": 130, "blank": 0, "requests": 130, "results": 130, "errors": 0
    }  # fmt: skip
    assert summary["shards"][0]["mode"] == "batch" and summary["shards"][0]["paths"] == {"batch": 100, "direct": 30}
    results = _results(tmp_path / "out", "batched")
    assert [r["custom_id"] for r in results] == [f"b-{n}" for n in range(100)] + [f"m-{n}" for n in range(30)]
    assert {r["response"]["body"]["object"] for r in results[:100]} == {"chat.completion"}
    assert {r["response"]["body"]["type"] for r in results[100:]} == {"message"}
    # priced as run: the job's records at Bedrock's batch price, half the direct one
    costs = summary["cost_estimate_usd"]
    assert costs["provider_all_batch"] < costs["provider"] < costs["provider_all_direct"]


def test_auto_batches_a_shard_as_big_as_its_threshold_and_sends_a_small_file_direct(tmp_path: Path) -> None:
    big = write_jsonl(tmp_path / "big.jsonl", [_chat(f"a-{n}") for n in range(1000)])
    done, summary = _run(big, tmp_path / "big", "--mode", "auto", "--quiet")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert summary["status"] == "SUCCEEDED" and summary["counts"]["results"] == 1000
    assert [(s["mode"], s["paths"]) for s in summary["shards"]] == [("batch", {"batch": 1000})]

    small = write_jsonl(tmp_path / "small.jsonl", [_chat(f"s-{n}") for n in range(20)])
    done, summary = _run(small, tmp_path / "small", "--mode", "auto", "--quiet")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert [(s["mode"], s["paths"]) for s in summary["shards"]] == [("direct", {"direct": 20})]
