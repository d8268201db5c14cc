"""One file, any provider, for Responses lines (issue 32): a job of chat-completions and `/v1/responses`
lines on Anthropic and on Bedrock, direct and batch, answers every line, each in its own shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from sluice_local.cloud import run_job
from tests.conftest import request_line, write_jsonl

MODELS = {"anthropic": "claude-3-5-haiku-latest", "bedrock": "anthropic.claude-3-haiku-20240307-v1:0"}
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


def mixed_lines(model: str, count: int) -> list[bytes]:
    """`count` lines, chat and Responses in turn, as `examples/reviews.jsonl` has them."""
    lines = []
    for n in range(count):
        url = RESPONSES if n % 2 else CHAT
        line = orjson.loads(request_line(f"r-{n}", "great value" if n % 4 < 2 else "awful, broken", url=url))
        line["body"]["model"] = model
        line["body"]["max_output_tokens" if url == RESPONSES else "max_tokens"] = 4
        lines.append(orjson.dumps(line) + b"\n")
    return lines


def assert_each_line_answered_in_its_shape(results: list[dict[str, Any]], model: str, count: int) -> None:
    assert [r["custom_id"] for r in results] == [f"r-{n}" for n in range(count)]
    for n, result in enumerate(results):
        body = result["response"]["body"]
        word = "positive" if n % 4 < 2 else "negative"
        if n % 2:
            assert body["object"] == "response" and body["status"] == "completed" and body["model"] == model
            [item] = body["output"]
            assert (item["type"], item["role"], item["status"]) == ("message", "assistant", "completed")
            assert item["content"] == [{"type": "output_text", "text": word, "annotations": []}]
            usage = body["usage"]
            assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
            assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        else:
            assert body["object"] == "chat.completion"
            assert body["choices"][0]["message"]["content"] == word


def tokens_of(results: list[dict[str, Any]]) -> tuple[int, int]:
    bodies = [r["response"]["body"] for r in results]
    chat = [b["usage"] for b in bodies if b["object"] == "chat.completion"]
    responses = [b["usage"] for b in bodies if b["object"] == "response"]
    return (
        sum(u["prompt_tokens"] for u in chat) + sum(u["input_tokens"] for u in responses),
        sum(u["completion_tokens"] for u in chat) + sum(u["output_tokens"] for u in responses),
    )


@pytest.mark.parametrize("provider", ["anthropic", "bedrock"])
def test_a_direct_job_answers_responses_lines_as_responses(make_cloud, simulator, tmp_path: Path, provider) -> None:
    simulator.reset()
    model = MODELS[provider]
    quota = orjson.dumps({model: {"rpm": 6000, "tpm": 1_000_000}}).decode()
    cloud = make_cloud(provider=provider, shard_lines=10, rate_limits=quota)
    run = run_job(cloud, write_jsonl(tmp_path / "mixed.jsonl", mixed_lines(model, 20)))

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert run.errors == []
    assert_each_line_answered_in_its_shape(run.results, model, 20)
    # the summary counts a Responses line's tokens as it counts a chat line's
    tokens = run.summary["tokens"]
    assert (tokens["input"], tokens["output"]) == tokens_of(run.results)


def test_a_batch_job_on_anthropic_answers_responses_lines_as_responses(make_cloud, simulator, tmp_path: Path) -> None:
    simulator.reset()
    model = MODELS["anthropic"]
    cloud = make_cloud(provider="anthropic", shard_lines=20, batch_max_requests=20, poll_seconds=1)
    simulator.configure(batch_phase_s=0.1)
    run = run_job(
        cloud, write_jsonl(tmp_path / "mixed.jsonl", mixed_lines(model, 40)), metadata={"sluice-mode": "batch"}
    )

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert run.errors == [] and [s["mode"] for s in run.summary["shards"]] == ["batch"] * 2
    assert_each_line_answered_in_its_shape(run.results, model, 40)
    assert [e for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/messages"] == []
    tokens = run.summary["tokens"]
    assert (tokens["input"], tokens["output"]) == tokens_of(run.results)


def test_a_batch_job_on_bedrock_answers_responses_lines_as_responses(make_cloud, simulator, tmp_path: Path) -> None:
    simulator.reset()
    model = MODELS["bedrock"]
    # a Bedrock job takes 100 records at least, and a file holds one endpoint: 100 lines of each
    cloud = make_cloud(provider="bedrock", shard_lines=200, poll_seconds=1)
    run = run_job(
        cloud, write_jsonl(tmp_path / "mixed.jsonl", mixed_lines(model, 200)), metadata={"sluice-mode": "batch"}
    )

    assert run.status == "SUCCEEDED", run.summary.get("error")
    assert run.errors == [] and [s["mode"] for s in run.summary["shards"]] == ["batch"]
    assert_each_line_answered_in_its_shape(run.results, model, 200)
    assert not [e for e in simulator.log if e["path"].startswith("/model/") and e["path"].endswith("/converse")]
    tokens = run.summary["tokens"]
    assert (tokens["input"], tokens["output"]) == tokens_of(run.results)
