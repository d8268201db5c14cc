"""Fail fast on a provider that cannot answer (issue 31).

A wrong base URL (404 on every path), a model the provider does not serve, a key it refuses, a
provider (or a proxy before it) that fails every request with a 5xx however often it is asked
(for `OUTAGE_S` at least): every request of the job gets the same answer, and sending the rest only takes time. When
`REFUSAL_ANSWERS` answers of a direct shard's run are one such error (the same status, code and
message) before any other answer, the run stops taking lines and gives up the requests still in
flight (issue 42: a server that cannot keep up may hold one for the whole request timeout); the
shard writes the lines it did not send, and those given up, to the errors file as
`provider_refused`, each carrying the provider's error, and leaves a note
(`ShardSpec.refusal_key`) that Merge turns into the summary's `provider_refused`.

The decision does not depend on which request answers first: an outcome that says nothing of
the provider as a whole (a connection lost or timed out, 429s to the end: a busy provider)
neither counts nor ends the watch; an answer (a success, a body that failed the job's checks)
or another error ends it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from sluice.contract import ProviderRefused, causes
from sluice.contract.model import ErrorCode, Outcome
from sluice.core.aws_errors import read_json_if_any
from sluice.providers import RequestFormat

# how many answers of a run must all be the same non-retryable error before it stops sending
REFUSAL_ANSWERS = 20
# how long a 5xx on every attempt must last before it is a refusal (`RefusalWatch`)
OUTAGE_S = 5.0

_MODEL_UNKNOWN = ("not found", "does not exist", "not exist", "unknown", "invalid model", "not supported")


def likely_cause(status: int, code: str | None, message: str) -> str:
    """The likely cause of a refusal, in plain words, from the status and what the provider said."""
    text = f"{code or ''} {message}".lower()
    about_model = "model" in text and any(word in text for word in _MODEL_UNKNOWN)
    if status in (401, 403):
        return f"key refused: the provider did not accept the API key (HTTP {status})"
    if about_model or "model_not_found" in text:
        return "unknown model: the provider does not serve the model the requests name"
    if status == 404:
        return "wrong URL path: 404 on every request (check the base URL, usually ending in /v1)"
    if status in (400, 422):
        return f"request rejected: the provider refused the requests as invalid (HTTP {status})"
    if status >= 500:
        return (
            f"server error: HTTP {status} on every attempt of every request (the provider, or a proxy "
            "in front of it, is failing; try again later)"
        )
    return f"request refused: HTTP {status} on every request"


def refusal_of(outcome: Outcome, request_format: RequestFormat) -> tuple[int, str | None, str] | None:
    """(status, provider code, provider message) of an answer retrying cannot change, or of a 5xx
    that did not change on any of the line's attempts; else None."""
    status = outcome.status_code
    if status is None:
        return None
    exhausted = outcome.error_code == ErrorCode.RETRIES_EXHAUSTED and status >= 500
    if outcome.error_code != ErrorCode.PROVIDER_ERROR and not exhausted:
        return None
    said = request_format.error(outcome.body, outcome.headers)
    code, message = said.code, said.message
    if message is None and isinstance(outcome.body, str) and outcome.body.strip():
        # not JSON (a web server's own 404 page, say): its text is the message
        message = outcome.body.strip()
    if exhausted:
        # Sluice's own words count the attempts: the provider's (none for a bare 500) are compared
        return status, code, message or ""
    return status, code, message or outcome.error_message or ""


def _neutral(outcome: Outcome) -> bool:
    """An outcome that says nothing of the provider as a whole: no answer (a connection lost, a
    timeout, to the last attempt), or 429s to the end (a busy provider, or a lost race for it)."""
    if outcome.error_code is None:
        return False
    if outcome.error_code == ErrorCode.PROVIDER_REFUSED:
        # given up once the watch had tripped
        return True
    return outcome.status_code is None or (
        outcome.error_code == ErrorCode.RETRIES_EXHAUSTED and outcome.status_code == 429
    )


class RefusalWatch:
    """Watches a run's first outcomes: `see` is True once `answers` of them were the same refusal
    with nothing but neutral outcomes (`_neutral`) among them, which `refused` then describes. Any
    other outcome (a success, another error) ends the watch.

    A 5xx on every attempt is a refusal only once it has lasted `outage_s` since the watch began:
    a provider down for a moment at the start is what the shard's last sweep is for (`sweep`),
    and one watch follows both the first pass and the sweep."""

    def __init__(
        self,
        answers: int,
        request_format: RequestFormat,
        *,
        outage_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.answers = answers
        self.format = request_format
        self.refused: ProviderRefused | None = None
        self._seen = 0
        self._first: tuple[int, str | None, str] | None = None
        self._watching = answers > 0
        self._clock = clock
        self._until = clock() + (OUTAGE_S if outage_s is None else outage_s)

    def see(self, outcome: Outcome) -> bool:
        if not self._watching:
            return False
        error = refusal_of(outcome, self.format)
        if error is None and _neutral(outcome):
            return False
        if error is None or (self._first is not None and error != self._first):
            self._watching = False
            return False
        self._first = error
        self._seen += 1
        if self._seen < self.answers:
            return False
        status, code, message = error
        if status >= 500 and self._clock() < self._until:
            return False
        self._watching = False
        self.refused = ProviderRefused(status=status, message=message, cause=likely_cause(status, code, message))
        return True


def unsent_message(refused: ProviderRefused, answers: int = REFUSAL_ANSWERS) -> str:
    """The error of a line a refusal kept from being sent."""
    return (
        f"not sent: the provider answered the first {answers} requests of this shard with HTTP "
        f"{refused.status}: {refused.message} (likely cause: {refused.cause})"
    )


def given_up_message(refused: ProviderRefused, answers: int = REFUSAL_ANSWERS) -> str:
    """The error of a line in flight when the refusal stopped the run: given up, not waited for."""
    return (
        f"given up unanswered: the request was in flight when the provider had answered the first {answers} "
        f"requests of this shard with HTTP {refused.status}: {refused.message} (likely cause: {refused.cause})"
    )


@causes.under(causes.RUN)
def write_refusal(s3: Any, bucket: str, key: str, refused: ProviderRefused) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=orjson.dumps(refused.to_dict()), ContentType="application/json")


def read_refusal(s3: Any, bucket: str, key: str) -> ProviderRefused | None:
    found = read_json_if_any(s3, bucket, key)
    return None if found is None else ProviderRefused.from_dict(found)
