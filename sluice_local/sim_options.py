"""The simulator's command-line options, shared by `sluice simulator` and `python -m sluice_local.simulator`
(`main`, which `sluice_local/simulator/__main__.py` runs).

Kept apart from the simulator so that `sluice --help` need not import aiohttp: the simulator is
imported once a command starts it, and knows nothing of these options.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sluice_local import checks

if TYPE_CHECKING:
    from sluice_local.simulator import SimConfig


def add_options(parser: argparse.ArgumentParser) -> None:
    """The simulator's command-line options, shared by `sluice simulator` and `python -m sluice_local.simulator`."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=checks.port,
        default=8000,
        help="port (default: 8000; 0: any free one, the first line says which)",
    )
    answers = parser.add_argument_group("answers")
    answers.add_argument("--latency", type=checks.seconds, default=0.05, help="seconds per answer (default: 0.05)")
    answers.add_argument(
        "--jitter", type=checks.seconds, default=0.0, help="each answer waits up to this many seconds more"
    )
    answers.add_argument("--seed", type=checks.whole_number, default=0, help="seed of every random choice (default: 0)")
    answers.add_argument(
        "--api-key",
        default=None,
        help="accept only this key, a bearer token or Anthropic's or Gemini's key header (default: any key; "
        "a request without one is refused as its provider refuses it)",
    )
    faults = parser.add_argument_group("faults (shares of requests, 0 to 1; together at most 1)")
    faults.add_argument("--rate-429", type=checks.fraction, default=0.0, help="answered 429 with Retry-After")
    faults.add_argument("--retry-after", type=checks.seconds, default=1.0, help="Retry-After of those 429s (s)")
    faults.add_argument("--rate-500", type=checks.fraction, default=0.0, help="answered 500")
    faults.add_argument("--rate-drop", type=checks.fraction, default=0.0, help="connection dropped without an answer")
    faults.add_argument("--rate-slow", type=checks.fraction, default=0.0, help="answered after --slow seconds")
    faults.add_argument("--slow", type=checks.seconds, default=5.0, help="seconds of a slow answer")
    flex = parser.add_argument_group("flex processing (OpenAI's service_tier: flex, Gemini's serviceTier: flex)")
    flex.add_argument(
        "--flex-slowdown",
        type=checks.positive_number,
        default=2.0,
        help="a flex answer waits this many times as long (default: 2)",
    )
    flex.add_argument(
        "--flex-unavailable",
        type=checks.fraction,
        default=0.05,
        help="share of flex requests answered 429 (OpenAI's resource_unavailable, Gemini's RESOURCE_EXHAUSTED), "
        "as on a busy day (default: 0.05)",
    )
    flex.add_argument(
        "--flex-refusing-models",
        default="gpt-4o,gpt-4o-mini",
        metavar="MODELS",
        help="models whose flex requests are refused 400, separated by commas (default: gpt-4o,gpt-4o-mini)",
    )
    output = parser.add_argument_group("answers a pipeline cannot use (shares of answers, 0 to 1; together at most 1)")
    output.add_argument("--rate-off-schema", type=checks.fraction, default=0.0, help="JSON off the request's schema")
    output.add_argument(
        "--rate-invalid-json", type=checks.fraction, default=0.0, help="not JSON, though JSON was asked for"
    )
    output.add_argument("--rate-truncated", type=checks.fraction, default=0.0, help="cut short at the output limit")
    output.add_argument("--rate-refusal", type=checks.fraction, default=0.0, help="a refusal")
    limits = parser.add_argument_group("rate limits (answered 429 with x-ratelimit-* headers)")
    limits.add_argument("--rpm", type=checks.whole_number, default=0, help="requests per minute (0: none)")
    limits.add_argument("--tpm", type=checks.whole_number, default=0, help="tokens per minute (0: none)")
    limits.add_argument(
        "--quota-rpm",
        type=checks.whole_number,
        default=0,
        help="requests per minute per API key, as a provider's quota (0: none)",
    )
    limits.add_argument(
        "--quota-tpm", type=checks.whole_number, default=0, help="tokens per minute per API key (0: none)"
    )
    limits.add_argument(
        "--batch-queue-tokens",
        type=checks.whole_number,
        default=0,
        help="input tokens a model's running batches may hold, as OpenAI's and Gemini's batch queue limits (0: none)",
    )
    batches = parser.add_argument_group("batches")
    batches.add_argument(
        "--relative-results-url",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a Message Batch's results_url is a path, as a gateway may give it, not a whole URL (default: on)",
    )
    batches.add_argument(
        "--batch-cancel-answers",
        choices=("elapsed", "none"),
        default="elapsed",
        help="what a cancelled batch hands back: the rows it had finished (elapsed, the default) or none, "
        "which an expired batch then hands back too",
    )
    batches.add_argument(
        "--gemini-inline-limit",
        type=checks.whole_number,
        default=20 * 1024 * 1024,
        metavar="BYTES",
        help="the largest body Gemini takes inline, a generateContent or a batch of inline requests (default: 20 MB)",
    )
    hooks = parser.add_argument_group("webhooks")
    hooks.add_argument("--webhook-url", default=None, help="where to send response.* and batch.* events")
    hooks.add_argument("--webhook-secret", default=None, help="whsec_... used to sign them (default: unsigned)")


def config_from(args: argparse.Namespace) -> SimConfig:
    """The options as a SimConfig; ValueError names what does not fit together."""
    from sluice_local import simulator

    return simulator.SimConfig(
        latency_s=args.latency,
        jitter_s=args.jitter,
        rate_429=args.rate_429,
        retry_after_s=args.retry_after,
        rate_500=args.rate_500,
        rate_drop=args.rate_drop,
        rate_slow=args.rate_slow,
        rate_off_schema=args.rate_off_schema,
        rate_invalid_json=args.rate_invalid_json,
        rate_truncated=args.rate_truncated,
        rate_refusal=args.rate_refusal,
        slow_s=args.slow,
        rpm_limit=args.rpm,
        tpm_limit=args.tpm,
        quota_rpm=args.quota_rpm,
        quota_tpm=args.quota_tpm,
        batch_queue_limit=args.batch_queue_tokens,
        gemini_inline_limit=args.gemini_inline_limit,
        relative_results_url=args.relative_results_url,
        flex_slowdown=args.flex_slowdown,
        flex_unavailable_rate=args.flex_unavailable,
        flex_refusing_models=args.flex_refusing_models,
        batch_cancel_answers=args.batch_cancel_answers,
        seed=args.seed,
        api_key=args.api_key,
        webhook_url=args.webhook_url,
        webhook_secret=args.webhook_secret,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sluice_local.simulator`: the simulator with these options, until interrupted."""
    from sluice_local import simulator

    parser = argparse.ArgumentParser(
        prog="sluice simulator",
        description="Run the provider simulator: OpenAI-compatible, Anthropic, Bedrock and Gemini.",
    )
    add_options(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(simulator.serve(args.host, args.port, config))
    return 0
