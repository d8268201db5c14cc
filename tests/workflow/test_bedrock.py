"""A job on Amazon Bedrock, direct (issue 32): chat-completions lines sent to Converse and answered as
chat.completions, a native Messages line sent to InvokeModel and answered natively, every request
signed with the function's credentials and no API key read, what Converse cannot honour refused at Plan."""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote

import boto3
import orjson
from botocore.credentials import Credentials
from sluice.providers.bedrock import auth

from sluice_local.cloud import REGION, run_job
from tests.conftest import request_line, write_jsonl

MODEL = "anthropic.claude-3-haiku-20240307-v1:0"


def messages_line(custom_id: str, text: str) -> bytes:
    body = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": text}]}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/messages", "body": body}) + b"\n"


def test_a_job_on_bedrock_answers_chat_lines_as_chat_completions(make_cloud, simulator, tmp_path: Path) -> None:
    simulator.reset()
    # Bedrock states no limits in its headers: the configured quota of the model paces the job
    quota = orjson.dumps({MODEL: {"rpm": 6000, "tpm": 1_000_000}}).decode()
    cloud = make_cloud(provider="bedrock", shard_lines=10, rate_limits=quota)
    lines = [request_line(f"c-{n}", "great value" if n % 2 else "awful, broken") for n in range(1, 21)]
    lines = [line.replace(b"gpt-4o-mini", MODEL.encode()) for line in lines]
    lines.append(messages_line("native", "Reply with one word, positive or negative:\n\nI loved it"))
    refused = orjson.loads(lines[4])
    refused["body"]["n"] = 2
    lines[4] = orjson.dumps(refused) + b"\n"
    run = run_job(cloud, write_jsonl(tmp_path / "bedrock.jsonl", lines))

    assert run.status == "SUCCEEDED"
    assert [r["custom_id"] for r in run.results] == [f"c-{n}" for n in range(1, 21) if n != 5] + ["native"]
    chat = [r["response"]["body"] for r in run.results[:-1]]
    assert {b["object"] for b in chat} == {"chat.completion"}
    assert {b["model"] for b in chat} == {MODEL}
    assert chat[0]["choices"][0]["message"] == {"role": "assistant", "content": "positive", "refusal": None}
    assert chat[1]["choices"][0]["message"]["content"] == "negative"
    assert {b["choices"][0]["finish_reason"] for b in chat} == {"stop"}
    assert all(
        b["usage"]["total_tokens"] == b["usage"]["prompt_tokens"] + b["usage"]["completion_tokens"] for b in chat
    )
    assert all(b["id"] == r["response"]["request_id"] for b, r in zip(chat, run.results, strict=False))
    native = run.results[-1]["response"]["body"]
    assert native["type"] == "message" and native["stop_reason"] == "end_turn"
    assert native["content"] == [{"type": "text", "text": "positive"}]
    assert [(e["line"], e["error"]["code"]) for e in run.errors] == [(5, "unsupported_field")]
    assert "n: 2" in run.errors[0]["error"]["message"]
    assert run.summary["tokens"]["input"] > 0 and run.summary["tokens"]["output"] > 0
    sent = [entry for entry in simulator.log if entry["path"].startswith("/model/")]
    assert sorted({entry["path"] for entry in sent}) == [f"/model/{MODEL}/converse", f"/model/{MODEL}/invoke"]
    assert len(sent) == 20 and {entry["status"] for entry in sent} == {200}
    assert not [entry for entry in simulator.log if entry["path"].startswith("/v1/")]


def test_a_bedrock_job_reads_no_api_key(make_cloud, simulator, tmp_path: Path) -> None:
    simulator.reset()
    cloud = make_cloud(provider="bedrock")
    # the key's secret is gone: a family that signs never asks for it
    boto3.client("secretsmanager").delete_secret(SecretId=cloud.secret_arn, ForceDeleteWithoutRecovery=True)
    run = run_job(cloud, write_jsonl(tmp_path / "one.jsonl", [messages_line("a", "hi")]))
    assert run.status == "SUCCEEDED" and len(run.results) == 1


def _spend_the_quota(simulator, words: int) -> None:
    """Another client in the account empties the region's buckets, which start full with a minute's
    worth: the job then meets the quota's refill, not its first minute."""
    session = SimpleNamespace(region_name=REGION, get_credentials=lambda: Credentials("AKIDOTHER", "secret"))
    url = f"{simulator.url}/model/{quote(MODEL, safe='')}/converse"
    body = orjson.dumps({"messages": [{"role": "user", "content": [{"text": "word " * words}]}]})
    headers = auth.signer(session, REGION)("POST", url, {"Content-Type": "application/json"}, body)
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10).read()


def test_the_configured_quota_paces_a_bedrock_job_which_states_no_limits(make_cloud, simulator, tmp_path: Path) -> None:
    tpm = 3600
    simulator.configure(quota_rpm=60_000, quota_tpm=tpm)
    _spend_the_quota(simulator, 3000)
    simulator.clear_log()
    lines = [
        orjson.dumps(
            {
                "custom_id": f"q-{n}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": f"Say hi to {n}"}]},
            }
        )
        + b"\n"
        for n in range(40)
    ]
    path = write_jsonl(tmp_path / "paced.jsonl", lines)
    quota = orjson.dumps({MODEL: {"rpm": 60_000, "tpm": tpm}}).decode()
    cloud = make_cloud(
        provider="bedrock", shard_lines=10, concurrency=4, map_concurrency=4, max_attempts=8, rate_limits=quota
    )

    started = time.monotonic()
    run = run_job(cloud, path)
    wall = time.monotonic() - started

    # without the configured quota, half the lines run out of attempts against the spent quota
    assert run.verify(path).ok and len(run.results) == 40
    tokens = run.summary["tokens"]["input"] + run.summary["tokens"]["output"]
    # paced by the configured tokens a minute (60 a second): Bedrock's answers state no rate. Its
    # throttles state no spent quota either, so the shards' first wave may meet the empty bucket
    # (7 to 18 of about 50 calls were 429s here) before the pace holds
    assert wall >= tokens / (tpm / 60) * 0.6
