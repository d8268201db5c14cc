"""`sluice estimate`: requests, tokens and cost of a file, by model; no AWS, no provider."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
from sluice.contract import Mode
from sluice.plan.deadline_choice import plan_lines
from sluice.providers import modes

from sluice_local.cli.estimate_deadline import deadline_plan
from sluice_local.console import EXIT_OK, human_seconds, human_usd
from sluice_local.inputs import estimate_file, require_valid


def run(args: argparse.Namespace) -> int:
    est = estimate_file(
        Path(args.file),
        model=args.model,
        assumed_output_tokens=args.output_tokens,
        concurrency=args.concurrency,
        latency_s=args.latency,
        shard_lines=args.shard_lines,
        quiet=args.quiet,
        provider=args.provider,
    )
    require_valid(est.check, allow_invalid=args.allow_invalid)
    data = {"provider": args.provider, **est.to_dict()}
    if args.invalid_rate is not None:
        data["validation"] = resubmissions(data, args.invalid_rate, args.validate_attempts)
    plan = deadline_plan(args, est) if args.deadline else None
    if plan is not None:
        data["deadline"] = plan.to_dict()
    if args.json:
        print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return EXIT_OK
    check = est.check
    urls = ", ".join(f"{url} {n:,}" for url, n in sorted(check.by_url.items()))
    print(
        f"{check.path}: {check.requests:,} requests "
        f"({check.lines:,} lines, {check.blank:,} blank, {check.invalid:,} invalid)"
    )
    print(f"  endpoints: {urls}; provider: {args.provider}")
    width = max([len("model"), *(len(m) for m in data["models"])])
    print(f"  {'model':<{width}} {'requests':>9} {'input tok':>11} {'exp. output':>11} {'direct':>11} {'batch':>11}")
    for model, row in data["models"].items():
        print(
            f"  {model:<{width}} {row['requests']:>9,} {row['input_tokens']:>11,} {row['output_tokens']:>11,} "
            f"{human_usd(row['direct_usd']):>11} {human_usd(row['batch_usd']):>11}"
        )
    a = data["assumptions"]

    def costs(kind: str) -> str:
        return costs_of(data[kind])

    uncapped = sum(row["requests_without_max_tokens"] for row in data["models"].values())
    print(
        f"  provider, expected: {costs('provider_usd')} — each answer {a['output_tokens']} tokens "
        "(--output-tokens) or its max_tokens if lower"
    )
    bound = (
        "every answer as long as its max_tokens allows"
        if not uncapped
        else f"not a bound: {uncapped:,} requests set no max_tokens and count {a['output_tokens']} tokens each"
    )
    print(f"  provider, at most:  {costs('provider_usd_at_most')} — {bound}")
    print(f"  provider, at least: {costs('provider_usd_at_least')} — one output token an answer")
    if "validation" in data:
        v = data["validation"]
        print(
            f"  with validation:    expected {costs_of(v['provider_usd'])} — {v['expected_sends_per_line']:.3f} sends "
            f"a line, {v['invalid_rate']:.0%} of answers sent again, up to {v['attempts']} sends; at most "
            f"{costs_of(v['provider_usd_at_most'])} (a repair turn adds input tokens, not counted)"
        )
    for model, row in data["models"].items():
        if row["price"] is not None:
            print(f"  {model}: {price_text(row['price'])}")
    if Mode.BATCH in modes(args.provider):
        print("  (Batch API: the model's batch price, half of list for most, results within 24 h)")
    else:
        print(f"  (Batch API: results within 24 h; the {args.provider} provider has none Sluice runs)")
    unpriced = [m for m, row in data["models"].items() if row["direct_usd"] is None]
    if unpriced:
        print(f"  no list price known for: {', '.join(unpriced)} (not in the totals)")
    print(
        f"  AWS (estimate): {human_usd(data['aws_usd'])} — Lambda, Step Functions, DynamoDB and S3 for about "
        f"{human_seconds(a['wall_seconds'])} at concurrency {a['concurrency']:,} and {a['latency_s']} s a request"
    )
    if plan is not None:
        print("deadline plan:")
        for line in plan_lines(plan):
            print(line)
    print(
        f"  input tokens: ~{a['bytes_per_token']} bytes of prompt a token, plus a few a message (within about "
        "20% for English prose; each provider, and the simulator, counts its own way)"
    )
    return EXIT_OK


def costs_of(usd: dict[str, Any]) -> str:
    return f"direct/background {human_usd(usd['direct'])}, batch {human_usd(usd['batch'])}"


def expected_sends(invalid_rate: float, attempts: int) -> float:
    """The sends a line gets on average when each answer fails its checks at `invalid_rate` and a
    line is sent at most `attempts` times: 1 + r + r² + … + r^(attempts-1)."""
    return sum(invalid_rate**k for k in range(attempts))


def resubmissions(data: dict[str, Any], invalid_rate: float, attempts: int) -> dict[str, Any]:
    """What output validation's resubmissions add to the provider's cost: expected, and at most
    (every line sent `attempts` times)."""
    factor = expected_sends(invalid_rate, attempts)

    def scaled(usd: dict[str, float | None], by: float) -> dict[str, float | None]:
        return {kind: None if value is None else value * by for kind, value in usd.items()}

    return {
        "invalid_rate": invalid_rate,
        "attempts": attempts,
        "expected_sends_per_line": round(factor, 6),
        "provider_usd": scaled(data["provider_usd"], factor),
        "provider_usd_at_most": scaled(data["provider_usd_at_most"], attempts),
    }


def price_text(price: dict[str, Any]) -> str:
    """`$5/M in ($0.5 cached), $30/M out; batch $2.5/$15 (genai-prices openai/gpt-5.5)`."""
    names = (("cached_input", "cached"), ("cache_write", "cache write"))
    extra = [f"${price[key]:g} {name}" for key, name in names if price[key] is not None]
    cached = f" ({', '.join(extra)})" if extra else ""
    return (
        f"${price['input']:g}/M in{cached}, ${price['output']:g}/M out; "
        f"batch ${price['batch_input']:g}/${price['batch_output']:g} ({price['source']})"
    )
