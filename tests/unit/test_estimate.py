"""`sluice estimate`: what its token and cost figures are, and that it says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from sluice_local.cli import main
from sluice_local.inputs import estimate_file, output_limit, output_tokens


def _line(custom_id: str, url: str, body: dict[str, Any]) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + b"\n"


def _chat(n: int, **limits: int) -> bytes:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x" * 400}], **limits}
    return _line(f"c-{n}", "/v1/chat/completions", body)


def test_the_expected_answer_is_the_assumption_capped_by_the_requests_own_limit() -> None:
    assert output_limit({"max_tokens": 4}) == 4
    assert output_limit({"max_output_tokens": 16}) == 16
    assert output_limit({"max_completion_tokens": 9, "max_tokens": 40}) == 9
    assert output_limit({"max_tokens": 0}) is None and output_limit({}) is None
    assert output_tokens("/v1/chat/completions", {"max_tokens": 4}, assumed=300) == 4
    assert output_tokens("/v1/chat/completions", {"max_tokens": 4}, assumed=2) == 2
    assert output_tokens("/v1/chat/completions", {}, assumed=300) == 300
    assert output_tokens("/v1/embeddings", {"max_tokens": 4}, assumed=300) == 0


def test_expected_at_most_and_at_least_bracket_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"".join([_chat(1, max_tokens=4), _chat(2, max_tokens=100), _chat(3)]))
    estimate = estimate_file(
        path, model=None, assumed_output_tokens=10, concurrency=10, latency_s=1.0, shard_lines=100, quiet=True
    )
    totals = estimate.by_model["gpt-4o-mini"]
    assert (totals.tokens_out, totals.tokens_out_max, totals.tokens_out_min, totals.uncapped) == (
        4 + 10 + 10,
        4 + 100 + 10,
        3,
        1,
    )
    data = estimate.to_dict()
    low, expected, high = (data[k]["direct"] for k in ("provider_usd_at_least", "provider_usd", "provider_usd_at_most"))
    assert low < expected < high
    assert data["provider_usd_at_most"]["batch"] == pytest.approx(high / 2, abs=1e-6)
    assert data["models"]["gpt-4o-mini"]["requests_without_max_tokens"] == 1


def test_the_text_names_each_figure_and_when_the_bound_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capped = tmp_path / "capped.jsonl"
    capped.write_bytes(b"".join(_chat(n, max_tokens=4) for n in range(5)))
    assert main(["estimate", str(capped), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "provider, expected:" in out and "300 tokens (--output-tokens) or its max_tokens if lower" in out
    assert "provider, at most:" in out and "every answer as long as its max_tokens allows" in out
    assert "provider, at least:" in out and "one output token an answer" in out

    loose = tmp_path / "loose.jsonl"
    loose.write_bytes(_chat(1, max_tokens=4) + _chat(2))
    assert main(["estimate", str(loose), "--quiet", "--output-tokens", "50"]) == 0
    out = capsys.readouterr().out
    assert "not a bound: 1 requests set no max_tokens and count 50 tokens each" in out


@pytest.mark.parametrize(
    ("model", "per_million"),
    [
        ("claude-3-5-haiku-latest", (0.80, 4.00)),
        ("claude-3-5-haiku-20241022", (0.80, 4.00)),
        ("claude-3-haiku-20240307", (0.25, 1.25)),
        ("claude-3-5-sonnet-latest", (3.00, 15.00)),
        ("claude-sonnet-4-20250514", (3.00, 15.00)),
        ("claude-opus-4", (15.00, 75.00)),
        ("anthropic.claude-3-haiku-20240307-v1:0", (0.25, 1.25)),
        ("anthropic.claude-3-5-haiku-20241022-v1:0", (0.80, 4.00)),
    ],
)
def test_a_claude_file_is_priced_direct_and_batch_at_half(
    model: str, per_million: tuple[float, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "claude.jsonl"
    body = {"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "x" * 400}]}
    path.write_bytes(b"".join(_line(f"c-{n}", "/v1/chat/completions", body) for n in range(10)))
    assert main(["estimate", str(path), "--quiet", "--json", "--provider", "anthropic"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    row = data["models"][model]
    direct = (row["input_tokens"] * per_million[0] + row["output_tokens"] * per_million[1]) / 1_000_000
    assert data["provider"] == "anthropic"
    assert row["direct_usd"] == pytest.approx(direct, rel=1e-3) and row["batch_usd"] == pytest.approx(
        direct / 2, rel=1e-3
    )
    assert main(["estimate", str(path), "--quiet", "--provider", "anthropic"]) == 0
    out = capsys.readouterr().out
    assert "no list price known" not in out and f"provider, expected: direct/background ${direct:.4f}" in out


def test_a_line_the_provider_cannot_take_is_invalid_before_anything_is_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sluice_local.console import EXIT_INPUT

    path = tmp_path / "mixed.jsonl"
    embedding = _line("e-1", "/v1/embeddings", {"model": "claude-3-5-haiku-latest", "input": "hi"})
    path.write_bytes(_chat(1) + embedding)
    assert main(["estimate", str(path), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["estimate", str(path), "--quiet", "--provider", "anthropic"]) == EXIT_INPUT
    assert "line 2: unsupported url '/v1/embeddings'" in capsys.readouterr().err
    assert main(["estimate", str(path), "--quiet", "--provider", "anthropic", "--allow-invalid", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["models"]["gpt-4o-mini"]["requests"] == 1


def test_estimate_prices_the_resubmissions_validation_expects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "checked.jsonl"
    path.write_bytes(b"".join(_chat(n, max_tokens=4) for n in range(5)))
    assert main(["estimate", str(path), "--quiet", "--json"]) == 0
    plain = orjson.loads(capsys.readouterr().out)
    assert "validation" not in plain
    assert main(["estimate", str(path), "--quiet", "--json", "--invalid-rate", "0.2", "--validate-attempts", "3"]) == 0
    checked = orjson.loads(capsys.readouterr().out)["validation"]
    assert checked["expected_sends_per_line"] == pytest.approx(1.24)
    assert checked["provider_usd"]["direct"] == pytest.approx(plain["provider_usd"]["direct"] * 1.24, rel=1e-3)
    assert checked["provider_usd_at_most"]["batch"] == pytest.approx(
        plain["provider_usd_at_most"]["batch"] * 3, rel=1e-3
    )
    assert main(["estimate", str(path), "--quiet", "--invalid-rate", "0.2"]) == 0
    assert "with validation:    expected" in capsys.readouterr().out


def test_a_bedrock_file_counts_its_caps_and_prompts_as_on_openai(tmp_path: Path) -> None:
    # a chat line is read for Bedrock as its Converse body: the cap and the system prompt move
    model = "anthropic.claude-3-haiku-20240307-v1:0"
    system = {"role": "system", "content": "y" * 400}
    chat = {"model": model, "max_tokens": 4, "messages": [system, {"role": "user", "content": "x" * 400}]}
    native = {
        "model": model,
        "max_tokens": 4,
        "system": "y" * 400,
        "messages": [{"role": "user", "content": "x" * 400}],
    }
    path = tmp_path / "bedrock.jsonl"
    path.write_bytes(_line("c", "/v1/chat/completions", chat) + _line("m", "/v1/messages", native))
    estimate = estimate_file(
        path, model=None, assumed_output_tokens=300, concurrency=10, latency_s=1.0, shard_lines=100,
        quiet=True, provider="bedrock",
    )  # fmt: skip
    (totals,) = estimate.by_model.values()
    assert (totals.tokens_out, totals.tokens_out_max, totals.uncapped) == (8, 8, 0)
    # both lines' system prompts and turns count, about 200 tokens each
    assert totals.tokens_in >= 400


def test_a_line_counts_alike_whichever_family_it_is_translated_for() -> None:
    from sluice.providers import family

    from sluice_local.inputs import output_limit, prompt_tokens

    chat = {
        "model": "m",
        "max_tokens": 40,
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Is this review good?"}],
    }
    expected = prompt_tokens("/v1/chat/completions", chat)
    models = {
        "anthropic": "claude-3-5-haiku-latest",
        "bedrock": "anthropic.claude-3-haiku",
        "gemini": "gemini-2.5-flash",
    }
    for name, model in models.items():
        wire = family(name).to_wire("/v1/chat/completions", {**chat, "model": model})
        # the system prompt beside the turns is one turn fewer, and no fewer tokens of text
        assert expected - 4 <= prompt_tokens("/v1/chat/completions", wire) <= expected, name
        assert output_limit(wire) == 40, name
