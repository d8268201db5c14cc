"""Checking an input file on this machine before it costs anything, and estimating what it will cost.

Validation uses the same `parse_line` as Plan and the shards, so a file that passes here
passes there, with the same messages.
"""

from __future__ import annotations

import math
import shlex
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sluice.contract import DEFAULT_PROVIDER
from sluice.contract.model import Request
from sluice.formats.lines import READ_CHUNK, LineError, parse_line, split_lines
from sluice.providers import family

from sluice_local.console import EXIT_INPUT, CliError, need_file, progress

SHOW_ERRORS = 10


@dataclass
class FileCheck:
    path: Path
    lines: int = 0
    blank: int = 0
    requests: int = 0
    invalid: int = 0
    # the first SHOW_ERRORS problems, as the user should read them
    errors: list[str] = field(default_factory=list)
    by_url: Counter[str] = field(default_factory=Counter)

    def error_report(self) -> str:
        shown = "\n".join(f"  {e}" for e in self.errors)
        more = self.invalid - len(self.errors)
        tail = f"\n  … and {more} more" if more > 0 else ""
        return f"{self.path}: {self.invalid} invalid line(s) of {self.lines}:\n{shown}{tail}"


def _chunks(path: Path, bar: Any) -> Iterator[bytes]:
    with path.open("rb") as fh:
        while chunk := fh.read(READ_CHUNK):
            bar.update(len(chunk))
            yield chunk


# what a compressed file starts with, and the command that decompresses it to standard output
# (gunzip -k and zstd -d refuse a name without their suffix: "unknown suffix"); zip names its members
COMPRESSED = (
    (b"\x1f\x8b", "gzip", "gunzip -c"),
    (b"PK\x03\x04", "zip", "unzip"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd -dc"),
)


def decompressed_name(path: Path) -> Path:
    """Where the plain copy of a compressed `path` goes: without its compression's suffix, else
    `.plain` before its own (a gzip file named f.jsonl: f.plain.jsonl)."""
    if path.suffix in (".gz", ".zst", ".zstd"):
        return path.with_suffix("")
    return path.with_name(f"{path.stem}.plain{path.suffix}")


def refuse_compressed(path: Path) -> None:
    """A compressed file would fail on its first line as 'not UTF-8'; say what it is, and a command
    that works whatever its name, instead."""
    with path.open("rb") as fh:
        head = fh.read(4)
    for magic, kind, undo in COMPRESSED:
        if head.startswith(magic):
            command = (
                f"{undo} {shlex.quote(str(path))}"
                if kind == "zip"
                else f"{undo} {shlex.quote(str(path))} > {shlex.quote(str(decompressed_name(path)))}"
            )
            raise CliError(
                f"{path}: is {kind}-compressed, and the input is read as plain JSONL: decompress it first ({command})",
                EXIT_INPUT,
            )


def model_of(request: Request) -> str | None:
    """The model a request names in its body (after --model), None when it names none."""
    body = orjson.loads(request.body) if request.body else {}
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None


def check_file(
    path: Path,
    *,
    on_request: Callable[[Request], None] | None = None,
    quiet: bool = False,
    provider: str = DEFAULT_PROVIDER,
) -> FileCheck:
    """Validate every line (and custom_id uniqueness) as Plan will for the provider family
    `provider` (a line it cannot send is invalid); hand each valid request to `on_request`."""
    need_file(path)
    refuse_compressed(path)
    check = FileCheck(path)
    request_format = family(provider)
    seen: dict[str, int] = {}
    with progress(total=path.stat().st_size, unit="B", desc="checking", quiet=quiet) as bar:
        for number, raw in enumerate(split_lines(_chunks(path, bar)), start=1):
            check.lines = number
            parsed = parse_line(raw, number, keep_body=on_request is not None, request_format=request_format)
            if parsed is None:
                check.blank += 1
                continue
            problem: str | None = None
            if isinstance(parsed, LineError):
                problem = parsed.message
            else:
                first = seen.setdefault(parsed.custom_id, number)
                if first != number:
                    problem = f"line {number}: duplicate custom_id {parsed.custom_id!r} (first on line {first})"
            if problem is not None:
                check.invalid += 1
                if len(check.errors) < SHOW_ERRORS:
                    check.errors.append(problem)
                continue
            assert isinstance(parsed, Request)
            check.requests += 1
            check.by_url[parsed.path] += 1
            if on_request is not None:
                on_request(parsed)
    if check.requests == 0 and check.invalid == 0:
        raise CliError(f"{path}: no requests in the file (it is empty or only blank lines)", EXIT_INPUT)
    return check


def require_valid(check: FileCheck, *, allow_invalid: bool) -> None:
    if check.invalid and not allow_invalid:
        raise CliError(
            check.error_report()
            + "\nfix them, or pass --allow-invalid to send the rest (bad lines go to the errors file)",
            EXIT_INPUT,
        )


# Roughly 4 bytes of English a token; good to ±20% for prose, which is all an estimate needs.
BYTES_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
OUTPUT_LIMIT_KEYS = ("max_completion_tokens", "max_output_tokens", "max_tokens")


# where a body holds its prompt's text, in the line's shape or the one its family translated it to
# (Messages' and Converse's `system`, Gemini's `systemInstruction`, `contents` and `parts`)
_TEXT_KEYS = (
    "system",
    "systemInstruction",
    "instructions",
    "messages",
    "contents",
    "input",
    "content",
    "parts",
    "text",
)
# where a body caps its answer: at its top, or in Converse's or Gemini's configuration
_CONFIGS = ("inferenceConfig", "generationConfig")
_CONFIG_LIMIT_KEYS = ("maxTokens", "maxOutputTokens")


def _text_of(value: Any) -> str:
    """Every string a prompt holds (message contents, input parts), ignoring keys and images."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(_text_of(v) for v in value)
    if isinstance(value, dict):
        parts = [_text_of(value[k]) for k in _TEXT_KEYS if k in value]
        return " ".join(p for p in parts if p)
    return ""


def prompt_tokens(path: str, body: dict[str, Any]) -> int:
    if path in ("/v1/chat/completions", "/v1/messages"):
        turns = body.get("messages", body.get("contents")) or []
        text = _text_of(body)
        overhead = MESSAGE_OVERHEAD_TOKENS * (len(turns) if isinstance(turns, list) else 1)
    elif path == "/v1/responses":
        text = _text_of(body)
        overhead = MESSAGE_OVERHEAD_TOKENS
    elif path == "/v1/embeddings":
        text, overhead = _text_of(body.get("input")), 0
    else:
        text, overhead = _text_of(body.get("prompt")), 0
    return math.ceil(len(text.encode()) / BYTES_PER_TOKEN) + overhead


def output_limit(body: dict[str, Any]) -> int | None:
    """The request's own cap on its answer (max_tokens and its newer names, or Converse's maxTokens
    and Gemini's maxOutputTokens: a chat line read for Bedrock or Gemini), if it sets one."""
    for key in OUTPUT_LIMIT_KEYS:
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value
    for name in _CONFIGS:
        config = body.get(name)
        for key in _CONFIG_LIMIT_KEYS:
            cap = config.get(key) if isinstance(config, dict) else None
            if isinstance(cap, int) and cap > 0:
                return cap
    return None


def output_tokens(path: str, body: dict[str, Any], assumed: int) -> int:
    """The expected answer length: `assumed` tokens, or less where the request caps its answer lower."""
    if path == "/v1/embeddings":
        return 0
    limit = output_limit(body)
    return assumed if limit is None else min(limit, assumed)


def price_row(model: str) -> dict[str, Any] | None:
    """The list prices an estimate used for `model`, USD per million tokens, and their source."""
    from sluice.core.costs import model_prices

    prices = model_prices(model)
    if prices is None:
        return None
    return {
        "input": prices.standard.input,
        "cached_input": prices.standard.cached_input,
        "cache_write": prices.standard.cache_write,
        "output": prices.standard.output,
        "batch_input": prices.batch.input,
        "batch_output": prices.batch.output,
        "source": prices.source,
    }


@dataclass
class ModelTotals:
    requests: int = 0
    tokens_in: int = 0
    # expected: the lesser of each request's max_tokens and the assumed answer length
    tokens_out: int = 0
    # at most: each request's max_tokens (the assumed length where it sets none: see `uncapped`)
    tokens_out_max: int = 0
    # at least: one token an answer
    tokens_out_min: int = 0
    uncapped: int = 0


@dataclass
class Estimate:
    check: FileCheck
    by_model: dict[str, ModelTotals]
    assumed_output_tokens: int
    concurrency: int
    latency_s: float
    shard_lines: int

    @property
    def wall_seconds(self) -> float:
        # the job runs `concurrency` requests at a time, each about `latency_s` long
        return math.ceil(self.check.requests / self.concurrency) * self.latency_s if self.check.requests else 0.0

    def provider_usd(self, *, batch: bool, output: str = "expected") -> dict[str, float | None]:
        from sluice.core.costs import provider_cost_usd

        def out(t: ModelTotals) -> int:
            return {"expected": t.tokens_out, "at_most": t.tokens_out_max, "at_least": t.tokens_out_min}[output]

        return {
            model: provider_cost_usd({model: [t.tokens_in, out(t)]}, batch=batch)
            for model, t in sorted(self.by_model.items())
        }

    def aws_usd(self) -> float:
        from sluice.core.costs import aws_cost_usd

        shards = math.ceil(self.check.lines / self.shard_lines) if self.check.lines else 0
        return aws_cost_usd(requests=self.check.requests, shards=shards, wall_seconds=self.wall_seconds)

    def to_dict(self) -> dict[str, Any]:
        direct, batch = self.provider_usd(batch=False), self.provider_usd(batch=True)

        def total(costs: dict[str, float | None]) -> float | None:
            known = [c for c in costs.values() if c is not None]
            return round(sum(known), 6) if known else None

        def totals(output: str) -> dict[str, float | None]:
            direct_total = total(self.provider_usd(batch=False, output=output))
            return {
                "direct": direct_total,
                "background": direct_total,
                "batch": total(self.provider_usd(batch=True, output=output)),
            }

        return {
            "file": str(self.check.path),
            "lines": self.check.lines,
            "blank": self.check.blank,
            "invalid": self.check.invalid,
            "requests": self.check.requests,
            "by_url": dict(self.check.by_url),
            "models": {
                model: {
                    "requests": t.requests,
                    "input_tokens": t.tokens_in,
                    "output_tokens": t.tokens_out,
                    "output_tokens_at_most": t.tokens_out_max,
                    "output_tokens_at_least": t.tokens_out_min,
                    "requests_without_max_tokens": t.uncapped,
                    "direct_usd": direct[model],
                    "batch_usd": batch[model],
                    "price": price_row(model),
                }
                for model, t in sorted(self.by_model.items())
            },
            # expected: output tokens as assumed, capped by each request's max_tokens
            "provider_usd": {"direct": total(direct), "background": total(direct), "batch": total(batch)},
            # an upper bound where every request sets max_tokens; a lower bound: one output token an answer
            "provider_usd_at_most": totals("at_most"),
            "provider_usd_at_least": totals("at_least"),
            "aws_usd": self.aws_usd(),
            "assumptions": {
                "output_tokens": self.assumed_output_tokens,
                "bytes_per_token": BYTES_PER_TOKEN,
                "concurrency": self.concurrency,
                "latency_s": self.latency_s,
                "shard_lines": self.shard_lines,
                "wall_seconds": self.wall_seconds,
            },
        }


def estimate_file(
    path: Path,
    *,
    model: str | None,
    assumed_output_tokens: int,
    concurrency: int,
    latency_s: float,
    shard_lines: int,
    quiet: bool = False,
    provider: str = DEFAULT_PROVIDER,
) -> Estimate:
    by_model: dict[str, ModelTotals] = {}

    def count(request: Request) -> None:
        body = orjson.loads(request.body) if request.body else {}
        name = model or str(body.get("model") or "(no model)")
        totals = by_model.setdefault(name, ModelTotals())
        totals.requests += 1
        totals.tokens_in += prompt_tokens(request.path, body)
        totals.tokens_out += output_tokens(request.path, body, assumed_output_tokens)
        if request.path != "/v1/embeddings":
            limit = output_limit(body)
            totals.tokens_out_max += assumed_output_tokens if limit is None else limit
            totals.tokens_out_min += 1
            totals.uncapped += limit is None

    check = check_file(path, on_request=count, quiet=quiet, provider=provider)
    return Estimate(check, by_model, assumed_output_tokens, concurrency, latency_s, shard_lines)
