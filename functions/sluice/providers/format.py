"""A provider family's request format: what the core asks of a provider's wire shape.

The engine, the limits, the budget, the figures and the cache speak to a provider only through a
`RequestFormat`: how a request authenticates and where it goes, what it asks for (its model, the
most output it may produce, the tokens a rate limit counts for it), what an answer says it took
(usage, the model that answered, whether it finished), what an error body says and which of its
codes mean congestion, and what the rate-limit headers say. Each family (`sluice.providers`)
implements it once; nothing outside this package names a field or header of a provider's wire.

A line may be written in another family's shape (OpenAI's chat completions, which every family
answers): `to_wire` translates its body when it is read, and `from_wire` its answer back.

Every method is pure and cheap: the engine calls `url`, `request_id`, `left` and `from_wire` on
its hot path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, TypeGuard

from ..contract.model import ServiceTier

# the two limits a provider puts on a key, each a minute: requests, and tokens
RateKind = Literal["requests", "tokens"]
REQUESTS: Final = "requests"
TOKENS: Final = "tokens"
RATE_KINDS: tuple[RateKind, ...] = (REQUESTS, TOKENS)

# how an answer ended (`RequestFormat.finish`): whole, cut short at its output limit (a result all
# the same), or not finished at all (still running, failed or cancelled)
Finish = Literal["complete", "cut_short", "unfinished"]
COMPLETE: Final = "complete"
CUT_SHORT: Final = "cut_short"
UNFINISHED: Final = "unfinished"


@dataclass(frozen=True, slots=True)
class Usage:
    """The tokens an answer says it took: `tokens_in` all its input, of which `cached_in` were
    read from the provider's prompt cache and `cache_write` written to it (each priced apart)."""

    tokens_in: int
    tokens_out: int
    cached_in: int = 0
    cache_write: int = 0


def token_counts(usage: Usage | None) -> list[int]:
    """An answer's tokens as the stats count them by model: [input, output], and the prompt cache's
    [reads, writes] after them only where it used the cache (so a job that uses none keeps the
    two counts it always had)."""
    if usage is None:
        return [0, 0]
    cache = [usage.cached_in, usage.cache_write] if usage.cached_in or usage.cache_write else []
    return [usage.tokens_in, usage.tokens_out, *cache]


def is_count(value: Any) -> TypeGuard[int]:
    """A count of something a body states: a whole number above 0 (True is no count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True, slots=True)
class ProviderError:
    """What an error body says: its code and message, each None when it does not say, and how long
    it asks to be left alone where a family says so in the body rather than a header (Gemini's
    `RetryInfo`): a floor under the next attempt's delay, as a Retry-After is."""

    code: str | None = None
    message: str | None = None
    retry_after_s: float | None = None


class Unsupported(ValueError):
    """A request a family's format cannot send as it was written: what it asks for that the provider
    cannot honour (`RequestFormat.to_wire`). The line is an error; nothing is sent."""


# signs one request of a family that authenticates with the function's AWS credentials rather than
# an API key: (method, url, headers, body) to the headers it is sent with, the signature's among them
Signer = Callable[[str, str, Mapping[str, str], bytes | None], dict[str, str]]


@dataclass(frozen=True, slots=True)
class RateLimits:
    """The key's limits an answer's headers state, a second; None where they state none."""

    requests_per_s: float | None = None
    tokens_per_s: float | None = None


class NoServiceTiers:
    """The tier methods of a family with no processing tiers (Anthropic's, Bedrock's): every
    request goes at the default, and no answer is billed at batch prices."""

    def added_tier(self, path: str, body: Mapping[str, Any], tier: ServiceTier) -> ServiceTier:
        return ""

    def tiered(self, body: bytes, tier: ServiceTier) -> bytes:
        return body

    def batch_priced(self, body: Any) -> bool:
        return False

    def tier_unavailable(self, status: int, body: Any) -> bool:
        return False

    def tier_refused(self, status: int, body: Any) -> bool:
        return False


class NoRateHeaders:
    """The rate-limit methods of a family whose answers state no limits (Bedrock's, Gemini's): the
    limiter paces by the configured limits of each model and by the throttles."""

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimits:
        return _NO_LIMITS

    def left(self, headers: Mapping[str, str], kind: RateKind) -> float | None:
        return None

    def reset_s(self, headers: Mapping[str, str], kind: RateKind, now: float) -> float | None:
        return None


_NO_LIMITS = RateLimits()


class RequestFormat(Protocol):
    """One provider family's wire shape, as the core asks for it."""

    @property
    def name(self) -> str:
        """The family's name, as `Settings.provider` and `ShardSpec.provider` give it."""

    @property
    def throttle_statuses(self) -> frozenset[int]:
        """HTTP statuses that mean the provider is throttling: retried, and the limiter backs off."""

    @property
    def congestion_codes(self) -> frozenset[str]:
        """Error codes in a body that mean the provider is congested, whatever the status: retried
        like a throttle, and counted as one."""

    @property
    def paths(self) -> frozenset[str]:
        """The request paths (an input line's `url`) the family answers."""

    @property
    def model_in_url(self) -> bool:
        """Whether a request's URL names its model (`route`), so that its URL is not its path's alone."""

    def auth_headers(self, api_key: str) -> dict[str, str]:
        """The headers that authenticate every request of a run with `api_key`."""

    def url(self, base_url: str, path: str) -> str:
        """The URL of a request for `path` (the input line's `url`) at `base_url`."""

    def route(self, path: str, body: bytes | None) -> tuple[str, bytes | None]:
        """For a family whose URL names the model (`model_in_url`): the path a request for `path` is
        sent to and the body it is sent, from the body `to_wire` made (which names its model, as
        every family's does, for the cache, the budget and the limits). Other families: both as given."""

    def model(self, body: Mapping[str, Any]) -> str:
        """The model a request body asks for; "" when it names none."""

    def output_cap(self, body: Mapping[str, Any], path: str, *, default: int) -> int:
        """The most output tokens a request may be billed for: its cap (`default` when its body sets
        none) times the answers it asks for; 0 for an endpoint that produces no output."""

    def estimate_tokens(self, body: Mapping[str, Any], path: str, *, default_output: int) -> int:
        """What the provider counts against a tokens-a-minute limit when it admits the request
        (`default_output`: the output assumed when the body sets no cap)."""

    def usage(self, body: Any) -> Usage | None:
        """The tokens an answer's body says it took; None when it does not say."""

    def counted_tokens(self, body: Any) -> int | None:
        """The tokens an answer counted against the key's tokens-a-minute limit, as its body says;
        None when it does not say."""

    def answered_model(self, body: Any) -> str | None:
        """The model an answer's body says answered; None when it names none."""

    def finish(self, body: Mapping[str, Any]) -> Finish:
        """How a successful answer ended: whole, cut short at its output limit, or unfinished."""

    def request_id(self, headers: Mapping[str, str] | None, body: Any) -> str | None:
        """The provider's id of one answer: from its headers, else its body (None: neither says)."""

    def error(self, body: Any, headers: Mapping[str, str] | None = None) -> ProviderError:
        """What an error answer's body (parsed JSON, or text) says, with its headers where a family
        puts the error's type there; tolerant of any shape."""

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimits:
        """The key's limits an answer's headers state."""

    def left(self, headers: Mapping[str, str], kind: RateKind) -> float | None:
        """What an answer's headers say is left of the key's `kind` limit; None when they say
        nothing readable."""

    def reset_s(self, headers: Mapping[str, str], kind: RateKind, now: float) -> float | None:
        """Seconds until the key's `kind` limit is full again, as an answer's headers say; None when
        they say nothing readable. `now`: wall-clock epoch seconds, for a provider that gives a time."""

    def to_wire(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The body the provider is sent for a line's `body` to `path`: a line written in another
        family's shape translated, else `body` itself. Raises `Unsupported` for a field it cannot honour."""

    def added_tier(self, path: str, body: Mapping[str, Any], tier: ServiceTier) -> ServiceTier:
        """The tier a request for `path` whose body (as `to_wire` made it) is `body` is sent at on top of
        its body (`Request.tier`): `tier` where the family takes it on that endpoint and the line names
        no tier of its own, else ""."""

    def tiered(self, body: bytes, tier: ServiceTier) -> bytes:
        """The encoded `body` as sent at the `added_tier` it was given (never "")."""

    def batch_priced(self, body: Any) -> bool:
        """Whether a successful answer's body says it was served at a tier billed at the family's
        Batch API prices (OpenAI's flex processing)."""

    def tier_unavailable(self, status: int, body: Any) -> bool:
        """Whether an error answer (`body` parsed) says the tier a request asked for has no capacity
        now (OpenAI's flex: 429 `resource_unavailable`, not billed): the request may go on at the
        standard tier."""

    def tier_refused(self, status: int, body: Any) -> bool:
        """Whether an error answer to a request sent at a tier says the model does not take that tier
        (a 400 naming it): its requests go at the standard tier instead."""

    def from_wire(
        self,
        path: str,
        body: Any,
        created: int,
        *,
        sent: bytes | None = None,
        request_id: str | None = None,
        tier: ServiceTier = "",
    ) -> Any:
        """A successful answer's body as the line's `path` has it answered: translated back to the
        shape the line was written in, else `body` itself (`created`: epoch seconds, now; `sent`: the
        body `to_wire` made, and `request_id` the answer's, for an answer that names neither its
        model nor its id; `tier`: the tier the request was sent at, for a family whose answer does
        not name it, so that the translation names it as `batch_priced` reads it)."""
