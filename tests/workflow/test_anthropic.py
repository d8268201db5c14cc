"""A job on Anthropic's Messages API (issue 32): chat-completions lines translated and answered as
chat.completions, native Messages lines answered natively, what Messages cannot honour refused at Plan."""

from __future__ import annotations

from pathlib import Path

import orjson

from sluice_local.cloud import JobRun, LocalCloud, run_job
from sluice_local.cloud.settings import LocalSettings
from tests.conftest import request_line, write_jsonl

MODEL = "claude-3-5-haiku-latest"


def messages_line(custom_id: str, text: str) -> bytes:
    body = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": text}]}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/messages", "body": body}) + b"\n"


def test_a_job_on_anthropic_answers_chat_lines_as_chat_completions(make_cloud, simulator, tmp_path: Path) -> None:
    simulator.reset()
    cloud = make_cloud(provider="anthropic", shard_lines=10)
    lines = [request_line(f"c-{n}", "great value" if n % 2 else "awful, broken") for n in range(1, 21)]
    lines = [line.replace(b"gpt-4o-mini", MODEL.encode()) for line in lines]
    lines.append(messages_line("native", "Reply with one word, positive or negative:\n\nI loved it"))
    refused = orjson.loads(lines[4])
    refused["body"]["n"] = 2
    lines[4] = orjson.dumps(refused) + b"\n"
    run = run_job(cloud, write_jsonl(tmp_path / "claude.jsonl", lines))

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
    native = run.results[-1]["response"]["body"]
    assert native["type"] == "message" and native["stop_reason"] == "end_turn"
    assert native["content"] == [{"type": "text", "text": "positive"}]
    assert all(r["response"]["request_id"].startswith("req_") for r in run.results)
    assert [(e["line"], e["error"]["code"]) for e in run.errors] == [(5, "unsupported_field")]
    assert "n: 2" in run.errors[0]["error"]["message"]
    assert run.summary["tokens"]["input"] > 0 and run.summary["tokens"]["output"] > 0
    sent = [entry for entry in simulator.log if entry["path"].startswith("/v1/")]
    assert {entry["path"] for entry in sent} == {"/v1/messages"}
    assert len(sent) == 20


def run_on(simulator, path: Path, key: str, **settings: object) -> JobRun:
    """One job on a local cloud of its own, which is gone when it ends: what it keeps is in `cache_dir`."""
    cloud = LocalCloud(
        provider_base_url=simulator.base_url,
        api_key="sk-test",
        settings=LocalSettings(request_timeout_s=5.0, **settings),  # type: ignore[arg-type]
    )
    with cloud.running():
        return run_job(cloud, path, key=key)


def test_an_openai_answer_in_the_cache_is_not_served_to_an_anthropic_job(simulator, tmp_path: Path) -> None:
    # chat lines that Messages takes as they are: the same bodies go to either family
    def line(n: int) -> bytes:
        body = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": f"review {n}"}]}
        return orjson.dumps({"custom_id": f"c-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body})

    path = write_jsonl(tmp_path / "same.jsonl", [line(n) + b"\n" for n in range(5)])
    cache_dir = str(tmp_path / "cache")
    simulator.reset()
    first = run_on(simulator, path, "inbox/same.jsonl", cache_dir=cache_dir)
    assert first.status == "SUCCEEDED"
    assert [e["path"] for e in simulator.log if e["path"].startswith("/v1/")] == ["/v1/chat/completions"] * 5
    assert run_on(simulator, path, "inbox/twice/same.jsonl", cache_dir=cache_dir).summary["cache"]["hits"] == 5

    simulator.clear_log()
    again = run_on(simulator, path, "inbox/again/same.jsonl", cache_dir=cache_dir, provider="anthropic")
    assert again.status == "SUCCEEDED" and again.summary["cache"]["hits"] == 0
    assert [e["path"] for e in simulator.log if e["path"].startswith("/v1/")] == ["/v1/messages"] * 5
    assert all(r["response"]["request_id"].startswith("req_") for r in again.results)
    # what the Anthropic job filled answers its own re-run
    simulator.clear_log()
    third = run_on(simulator, path, "inbox/third/same.jsonl", cache_dir=cache_dir, provider="anthropic")
    assert third.summary["cache"]["hits"] == 5 and not [e for e in simulator.log if e["path"].startswith("/v1/")]
    assert [r["response"]["body"] for r in third.results] == [r["response"]["body"] for r in again.results]
