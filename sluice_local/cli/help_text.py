"""The help of the options several `sluice` commands share (`sluice_local.cli.parser`)."""

from __future__ import annotations

BUDGET_HELP = (
    "spending cap in US dollars at list prices (12.50): the job stops sending once its estimated "
    "spend would pass it and ends BUDGET_EXCEEDED (exit 10); needs a priced model"
)

MODE_HELP = (
    "how shards talk to the provider: direct (a request a line, answered at once), background "
    "(Responses API lines as background responses, polled), batch (the provider's Batch API: half "
    "price, answers within 24 h on a real provider), or auto (batch for a shard of 1,000 requests "
    "or more, direct for a smaller one)"
)

PROVIDER_HELP = (
    "the provider family the job is sent to (openai also names what copies its API, such as vLLM); "
    "a chat-completions line runs on any family, translated, and is answered as a chat completion; "
    "bedrock runs locally at AWS_ENDPOINT_URL_BEDROCK_RUNTIME when set (signed with your AWS credentials, "
    "as boto3 finds them), else on the simulator"
)

MAX_ATTEMPTS_HELP = (
    "sends of a request at most, in all, before it goes to errors, a hard cap: when the first half fail on 429s, "
    "5xx or timeouts, the rest wait for the shard's last sweep, after its other lines (default: as the job needs: "
    "3, then rounds of 3 in the last sweep until the faults the shard saw, were they random, would end a line "
    "in errors less than once in 100 million; at most 22, and no round after 300 s of sweeping)"
)

MAX_ERROR_RATE_HELP = (
    "share of the requests that may fail before the job ends COMPLETED_WITH_ERRORS (exit 9), "
    "0 to 1; 0.001 allows 1 in 1,000 (default: 0, any failed line)"
)


def modes_by_provider() -> str:
    """`openai: direct, background, batch, auto; anthropic: ...`: each family's modes, as the code
    offers them (`sluice.providers.modes`), which the table of families in docs/providers.md says too."""
    from sluice import providers
    from sluice.contract import MODES, PROVIDERS, Mode

    def offered(family: str) -> str:
        return ", ".join(m for m in MODES if m == Mode.AUTO or m in providers.modes(family))

    each = "; ".join(f"{family}: {offered(family)}" for family in PROVIDERS)
    return f"modes by --provider: {each} (another is refused before anything is sent, exit 2)"
