"""`sluice estimate` and `sluice run --budget` price models from genai-prices' data: gpt-5.5, and a
Claude model whose answers read and write the prompt cache, each at the source's own rates."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from sluice_local.cli import main
from tests.conftest import write_jsonl

# genai-prices 0.2.5's list prices, USD per million tokens: what the outputs must show
GPT_55 = {"input": 5.0, "cached_input": 0.5, "output": 30.0, "batch_input": 2.5, "batch_output": 15.0}
SONNET_45 = {"input": 3.0, "cached_input": 0.3, "cache_write": 3.75, "output": 15.0}


@pytest.fixture(autouse=True)
def no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "SLUICE_PRICES"):
        monkeypatch.delenv(name, raising=False)


def _chat(custom_id: str) -> bytes:
    body = {"model": "gpt-5.5", "messages": [{"role": "user", "content": "Reply with one word: fine"}]}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": {**body, "max_tokens": 5}}
    return orjson.dumps(line) + b"\n"


def _cached_message(custom_id: str) -> bytes:
    system = [{"type": "text", "text": "You grade reviews. " * 30, "cache_control": {"type": "ephemeral"}}]
    body = {
        "model": "claude-sonnet-4-5",
        "system": system,
        "messages": [{"role": "user", "content": f"Review {custom_id}: fine shoes"}],
        "max_tokens": 5,
    }
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/messages", "body": body}) + b"\n"


def test_estimate_prices_gpt_5_5_from_the_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "ten.jsonl", [_chat(f"e-{n}") for n in range(10)])
    assert main(["estimate", str(path), "--json"]) == 0
    row = orjson.loads(capsys.readouterr().out)["models"]["gpt-5.5"]
    assert row["price"]["source"] == "genai-prices openai/gpt-5.5"
    assert {key: row["price"][key] for key in GPT_55} == GPT_55
    # 10 answers of at most 5 tokens: every request sets max_tokens
    expected = (row["input_tokens"] * 5.0 + row["output_tokens"] * 30.0) / 1e6
    assert row["direct_usd"] == pytest.approx(expected, abs=1e-6)
    assert row["batch_usd"] == pytest.approx(expected / 2, abs=1e-6)

    assert main(["estimate", str(path)]) == 0
    assert "gpt-5.5: $5/M in ($0.5 cached), $30/M out; batch $2.5/$15 (genai-prices openai/gpt-5.5)" in (
        capsys.readouterr().out
    )


def test_a_budget_on_gpt_5_5_runs_and_its_summary_is_priced_at_the_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "gpt.jsonl", [_chat(f"g-{n}") for n in range(6)])
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--budget", "1", "--latency", "0", "--quiet"]) == 0, (
        capsys.readouterr().err
    )
    summary = orjson.loads((out / "gpt.summary.json").read_bytes())
    assert summary["status"] == "SUCCEEDED" and summary["counts"]["results"] == 6
    tokens = summary["tokens"]
    expected = (tokens["input"] * 5.0 + tokens["output"] * 30.0) / 1e6
    assert summary["cost_estimate_usd"]["provider"] == pytest.approx(expected, abs=1e-6)
    assert 0 < summary["budget"]["spent_usd"] <= 1


def test_a_claude_budget_counts_cache_reads_and_writes_at_their_prices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "claude.jsonl", [_cached_message(f"c-{n}") for n in range(8)])
    out = tmp_path / "out"
    argv = ["run", str(path), "--out", str(out), "--provider", "anthropic", "--budget", "1", "--no-cache"]
    assert main([*argv, "--latency", "0", "--concurrency", "1", "--quiet"]) == 0, capsys.readouterr().err

    assert main(["estimate", str(path), "--provider", "anthropic", "--json"]) == 0
    price = orjson.loads(capsys.readouterr().out)["models"]["claude-sonnet-4-5"]["price"]
    assert price["source"] == "genai-prices anthropic/claude-sonnet-4-5"
    assert {key: price[key] for key in SONNET_45} == SONNET_45

    usages = [
        orjson.loads(r)["response"]["body"]["usage"] for r in (out / "claude.results.jsonl").read_bytes().splitlines()
    ]
    # one at a time, the first answer writes the system prompt to the cache and the others read it
    assert usages[0]["cache_creation_input_tokens"] > 0 and usages[0]["cache_read_input_tokens"] == 0
    assert all(u["cache_read_input_tokens"] == usages[0]["cache_creation_input_tokens"] for u in usages[1:])
    expected = (
        sum(
            u["input_tokens"] * 3.0
            + u["cache_read_input_tokens"] * 0.3
            + u["cache_creation_input_tokens"] * 3.75
            + u["output_tokens"] * 15.0
            for u in usages
        )
        / 1e6
    )
    summary = orjson.loads((out / "claude.summary.json").read_bytes())
    assert summary["cost_estimate_usd"]["provider"] == pytest.approx(expected, abs=1e-6)
    # what the cache saved shows: the same tokens all at the input price cost more
    uncached = sum((u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]) * 3.0
                   + u["output_tokens"] * 15.0 for u in usages) / 1e6  # fmt: skip
    assert summary["cost_estimate_usd"]["provider"] < uncached
    assert summary["budget"]["spent_usd"] == pytest.approx(expected, abs=1e-6)
