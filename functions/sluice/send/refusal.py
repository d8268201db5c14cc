"""Fail fast on a provider that cannot answer (issue 31).

A wrong base URL (404 on every path), a model the provider does not serve, a key it refuses:
every request of the job gets the same non-retryable answer, and sending the rest only takes
time. When the first `REFUSAL_ANSWERS` answers of a direct shard's run are all one such error
(the same status, code and message), the run stops taking lines; the shard writes the lines it
did not send to the errors file as `provider_refused`, each carrying the provider's error, and
leaves a note (`ShardSpec.refusal_key`) that Merge turns into the summary's `provider_refused`.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluice.contract import ProviderRefused
from sluice.contract.model import ErrorCode, Outcome
from sluice.core.aws_errors import read_json_if_any
from sluice.providers import RequestFormat

# how many answers of a run must all be the same non-retryable error before it stops sending
REFUSAL_ANSWERS = 20

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
    return f"request refused: HTTP {status} on every request"


def refusal_of(outcome: Outcome, request_format: RequestFormat) -> tuple[int, str | None, str] | None:
    """(status, provider code, provider message) of an answer retrying cannot change, else None."""
    if outcome.error_code != ErrorCode.PROVIDER_ERROR or outcome.status_code is None:
        return None
    said = request_format.error(outcome.body, outcome.headers)
    code, message = said.code, said.message
    if message is None and isinstance(outcome.body, str) and outcome.body.strip():
        # not JSON (a web server's own 404 page, say): its text is the message
        message = outcome.body.strip()
    return outcome.status_code, code, message or outcome.error_message or ""


class RefusalWatch:
    """Watches the first `answers` outcomes of a run: `see` is True once they all were the same
    non-retryable error, which `refused` then describes. Any other outcome among them ends the watch."""

    def __init__(self, answers: int, request_format: RequestFormat) -> None:
        self.answers = answers
        self.format = request_format
        self.refused: ProviderRefused | None = None
        self._seen = 0
        self._first: tuple[int, str | None, str] | None = None
        self._watching = answers > 0

    def see(self, outcome: Outcome) -> bool:
        if not self._watching:
            return False
        error = refusal_of(outcome, self.format)
        if error is None or (self._first is not None and error != self._first):
            self._watching = False
            return False
        self._first = error
        self._seen += 1
        if self._seen < self.answers:
            return False
        self._watching = False
        status, code, message = error
        self.refused = ProviderRefused(status=status, message=message, cause=likely_cause(status, code, message))
        return True


def unsent_message(refused: ProviderRefused, answers: int = REFUSAL_ANSWERS) -> str:
    """The error of a line a refusal kept from being sent."""
    return (
        f"not sent: the provider answered the first {answers} requests of this shard with HTTP "
        f"{refused.status}: {refused.message} (likely cause: {refused.cause})"
    )


def write_refusal(s3: Any, bucket: str, key: str, refused: ProviderRefused) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=orjson.dumps(refused.to_dict()), ContentType="application/json")


def read_refusal(s3: Any, bucket: str, key: str) -> ProviderRefused | None:
    found = read_json_if_any(s3, bucket, key)
    return None if found is None else ProviderRefused.from_dict(found)
