"""Which provider a local run sends to, checked before anything is sent: per family, the variables
its own SDK reads for the base URL and the key (OPENAI_BASE_URL and OPENAI_API_KEY,
ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY, GOOGLE_GEMINI_BASE_URL and GEMINI_API_KEY or
GOOGLE_API_KEY), else the built-in simulator, which speaks every
family's dialect. The key is sent, never shown.

Bedrock has no key: with the endpoint variable boto3 reads (AWS_ENDPOINT_URL_BEDROCK_RUNTIME, then
AWS_ENDPOINT_URL) set, a local run sends its requests there, signed with the user's AWS credentials
(`sluice_local.bedrock_endpoint`); else to the simulator, and its batch jobs always to the local cloud's
emulation of batch inference."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sluice import providers
from sluice.contract import BEDROCK_PROVIDER, DEFAULT_PROVIDER, MODES, Mode

from sluice_local.bedrock_endpoint import UsersEndpoint, endpoint_variable
from sluice_local.console import EXIT_PROVIDER, EXIT_USAGE, CliError, say
from sluice_local.simulator import SimConfig, SimulatorServer

SIMULATOR_KEY = "sk-simulator"
# What a provider without an API key (a vLLM server started without --api-key) is sent: it
# ignores the header, and vLLM's own examples use this value.
NO_API_KEY = "EMPTY"
PROVIDER_CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ProviderEnv:
    """The variables a family's SDK reads, and the base URL it uses when none is set."""

    family: str
    base_url_var: str
    api_key_var: str
    official_url: str
    # whether the base URL names the API's version itself
    versioned: bool
    # what the base URL looks like, for a warning that it may not
    url_hint: str
    # the variable the SDK reads for the key when `api_key_var` is unset (Google's GOOGLE_API_KEY)
    fallback_key_var: str = ""
    # where a base URL that stops before the version lists the models, when not at /v1/models
    models_path: str = "/v1/models"

    @property
    def base_url(self) -> str:
        return os.environ.get(self.base_url_var, "").strip()

    @property
    def api_key(self) -> str:
        key = os.environ.get(self.api_key_var, "").strip()
        if not key and self.fallback_key_var:
            key = os.environ.get(self.fallback_key_var, "").strip()
        return key

    def models_url(self, base_url: str) -> str:
        """Where the family lists its models: an OpenAI base URL ends in its version (/v1), an
        Anthropic or Gemini one stops before it, as each SDK reads its variable."""
        base = base_url.rstrip("/")
        return base + "/models" if self.versioned or base.endswith("/v1") else base + self.models_path


OPENAI_ENV = ProviderEnv(
    DEFAULT_PROVIDER,
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "https://api.openai.com/v1",
    versioned=True,
    url_hint="an OpenAI-compatible base URL usually ends in /v1",
)
# a family not named here (Bedrock, signed with AWS credentials) runs on the simulator locally
PROVIDER_ENVS = {
    env.family: env
    for env in (
        OPENAI_ENV,
        ProviderEnv(
            "anthropic",
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_API_KEY",
            "https://api.anthropic.com",
            versioned=False,
            url_hint="an Anthropic base URL stops before /v1, as https://api.anthropic.com",
        ),
        ProviderEnv(
            "gemini",
            "GOOGLE_GEMINI_BASE_URL",
            "GEMINI_API_KEY",
            "https://generativelanguage.googleapis.com",
            versioned=False,
            url_hint="a Gemini base URL stops before /v1beta, as https://generativelanguage.googleapis.com",
            fallback_key_var="GOOGLE_API_KEY",
            models_path="/v1beta/models",
        ),
    )
}


def users_base_url(family: str) -> str:
    """The base URL the user set for `family`; "" when the run uses the simulator."""
    env = PROVIDER_ENVS.get(family)
    if env is not None:
        return env.base_url
    found = endpoint_variable() if family == BEDROCK_PROVIDER else None
    return found[1] if found else ""


def check_mode(family: str, mode: str | None) -> None:
    """Refuse a mode the family has no API for before anything starts, as Plan would after."""
    offered = providers.modes(family)
    if mode is None or mode == Mode.AUTO or mode in offered:
        return
    usable = ", ".join(m for m in MODES if m in offered or m == Mode.AUTO)
    what = {Mode.BATCH: "Batch API", Mode.BACKGROUND: "background responses"}.get(mode, mode)
    raise CliError(
        f"--mode {mode}: the {family} provider has no {what} Sluice can run; use one of {usable}", EXIT_USAGE
    )


def no_key_note(env: ProviderEnv) -> str:
    """What a provider is sent when its key variable is unset: the placeholder, as the header carries it."""
    header, value = next(iter(providers.family(env.family).auth_headers(NO_API_KEY).items()))
    return (
        f"{env.api_key_var} is not set: each request carries {header}: {value}, "
        "which a server started without a key (vLLM's default) ignores"
    )


# the built-in simulator's request log keeps this many of the latest requests: a run reads none
# of it, and a log of every request (about 500 bytes each) grew with the input
RUN_LOG_LIMIT = 1_000


@contextmanager
def provider(
    family: str, latency_s: float, endpoint: UsersEndpoint | None = None, batch_turnaround_s: float | None = None
) -> Iterator[tuple[str, str, str, SimulatorServer | None]]:
    """(base URL, key, what to say, the simulator if it is the one) of the user's provider for
    `family` when its base URL is set (with its key, or none: a vLLM server needs none), or its
    signed `endpoint` (Bedrock's), else of the simulator. A user's provider is checked before
    anything is sent (a signed endpoint by its first answers: it has no models list to ask)."""
    if endpoint is not None:
        where = (
            f"provider: {family} runtime at {endpoint.url} ({endpoint.variable}; requests signed with "
            f"the AWS credentials from {endpoint.credentials_from}, region {endpoint.region})"
        )
        # the local cloud keeps a secret for every run; a signed family never reads it
        yield endpoint.url, NO_API_KEY, where, None
        return
    env = PROVIDER_ENVS.get(family)
    if env is not None and env.base_url:
        api_key = env.api_key
        check_provider(env.base_url, api_key or NO_API_KEY, key_given=bool(api_key), env=env)
        note = "" if api_key else f" ({no_key_note(env)})"
        yield env.base_url, api_key or NO_API_KEY, f"provider: {env.base_url}{note}", None
        return
    if env is not None and env.api_key:
        say(
            f"note: {env.api_key_var} is set but {env.base_url_var} is not, so this run uses the simulator; "
            f"set {env.base_url_var}={env.official_url} to send it to {family}"
        )
    # a run cut short stops the simulator with requests in flight, which aiohttp's server logs
    # with a traceback; the job's outputs already say what happened to each of them
    server_log = logging.getLogger("aiohttp.server")
    level, server_log.level = server_log.level, logging.CRITICAL
    try:
        # a batch's three phases (validating, in progress, finalizing) share its turnaround
        config = SimConfig(latency_s=latency_s, log_limit=RUN_LOG_LIMIT)
        if batch_turnaround_s is not None:
            # a cancel ends within two polls of the local cloud, as the run's deadline margin expects
            config = config.updated({"batch_phase_s": batch_turnaround_s / 3, "batch_cancel_s": 2.0})
        with SimulatorServer(config) as sim:
            yield sim.base_url, SIMULATOR_KEY, f"provider: built-in SIMULATOR at {sim.base_url} (not a real model)", sim
    finally:
        server_log.setLevel(level)


def check_provider(
    base_url: str,
    api_key: str,
    *,
    key_given: bool = True,
    timeout_s: float = PROVIDER_CHECK_TIMEOUT_S,
    env: ProviderEnv = OPENAI_ENV,
) -> None:
    """One GET of the family's models list before anything is sent: a provider that cannot be reached,
    or that refuses the key, would otherwise turn every line of the job into an error.

    A 404 is said, as a warning: a server without /models answers it, but so does a base URL
    with a wrong path, which would refuse every line the same way. Any other answer (a 5xx)
    means it is there; the job's own retries deal with the rest.
    """
    import socket
    import urllib.error
    import urllib.request

    if not base_url.startswith(("http://", "https://")):
        raise CliError(f"{env.base_url_var}={base_url!r} is not an http(s) URL (e.g. {env.official_url})", EXIT_USAGE)
    if not env.versioned and base_url.rstrip("/").endswith("/v1"):
        # Anthropic's SDK (and so every other tool the user has) adds /v1 itself: the real API
        # answers such a URL's requests 404, so it is refused here rather than forgiven
        raise CliError(
            f"{env.base_url_var}={base_url!r} ends in /v1, which {env.family}'s SDK adds itself; "
            f"{env.url_hint}: set {env.base_url_var}={base_url.rstrip('/').removesuffix('/v1')}",
            EXIT_USAGE,
        )
    # the same headers the job will send, so the key is checked as the job will use it
    headers = {"User-Agent": "sluice-check", **providers.family(env.family).auth_headers(api_key)}
    request = urllib.request.Request(env.models_url(base_url), headers=headers)
    # the job's HTTP client connects directly, whatever HTTP(S)_PROXY says; so does the check
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            key = env.api_key_var if key_given else f"to answer without an API key ({env.api_key_var} is not set)"
            raise CliError(
                f"provider {base_url} refused {key}: HTTP {exc.code} on GET /models; nothing was sent",
                EXIT_PROVIDER,
            ) from exc
        if exc.code == 404:
            say(
                f"warning: provider {base_url} answered HTTP 404 to GET /models: if that is not the API's path "
                f"({env.url_hint}), every request will be refused alike, and "
                "the job stops once its first answers show it"
            )
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, socket.timeout | TimeoutError):
            why = f"no answer within {timeout_s:g} s"
        elif isinstance(reason, socket.gaierror):
            why = "its host name does not resolve"
        else:
            why = str(getattr(reason, "strerror", None) or reason)
        raise CliError(
            f"provider {base_url} is not reachable ({why}); nothing was sent. Check {env.base_url_var}, "
            "or unset it to use the built-in simulator",
            EXIT_PROVIDER,
        ) from exc
