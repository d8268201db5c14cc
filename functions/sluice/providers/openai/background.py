"""OpenAI's background Responses (`"background": true`): the requests, and how a response ends."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from sluice.contract.model import ErrorCode, Request

from ..background import Settled

# Only the Responses API can run a request in the background
BACKGROUND_URLS = frozenset({"/v1/responses"})
PENDING_STATUSES = frozenset({"queued", "in_progress", "cancelling"})
# a refused cancel is harmless when the response had ended anyway (OpenAI answers 4xx for those)
ENDED_STATUSES = frozenset({"completed", "failed", "cancelled", "cancelling", "incomplete", "expired"})


def submit_request(req: Request) -> Request:
    """The same request with `"background": true`, every other body field kept as sent."""
    body: dict[str, Any] = orjson.loads(req.body) if req.body else {}
    if not isinstance(body, dict):
        raise TypeError(f"line {req.line}: body must be a JSON object")
    body["background"] = True
    return replace(req, body=orjson.dumps(body))


def poll_request(line: int, custom_id: str, response_id: str) -> Request:
    return Request(
        line=line,
        custom_id=custom_id,
        method="GET",
        path=f"/v1/responses/{response_id}",
    )


def cancel_request(line: int, custom_id: str, response_id: str) -> Request:
    path = f"/v1/responses/{response_id}/cancel"
    return Request(line=line, custom_id=custom_id, method="POST", path=path, body=b"{}")


def output_text(body: dict[str, Any]) -> str:
    """All assistant text in a response, joined; empty when there is none.

    Reasoning items don't count: a response that spent its whole budget thinking has
    nothing for the user.
    """
    direct = body.get("output_text")
    if isinstance(direct, str) and direct:
        return direct
    parts: list[str] = []
    output = body.get("output")
    if not isinstance(output, list):
        return ""
    for item in output:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        content = item.get("content")
        if not isinstance(content, list):
            continue
        for piece in content:
            if isinstance(piece, dict) and piece.get("type") == "output_text":
                text = piece.get("text")
                if isinstance(text, str) and text:
                    parts.append(text)
    return "".join(parts)


def _error_message(body: dict[str, Any], fallback: str) -> str:
    error = body.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        code = error.get("code")
        if message and code:
            return f"{code}: {message}"
        if message or code:
            return str(message or code)
    return fallback


def settle(response_body: dict[str, Any]) -> Settled | None:
    """None while the response is still queued or running; otherwise how it ended.

    Settles on the finish reason, not the status alone: `incomplete` with output text is a
    result (its `incomplete_details` stay in the body), not an error.
    """
    status = response_body.get("status")
    if status in PENDING_STATUSES:
        return None
    status_text = str(status)
    if status == "completed":
        return Settled(status_text, response_body)
    if status == "incomplete":
        if output_text(response_body):
            return Settled(status_text, response_body)
        details = response_body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return Settled(
            status_text,
            response_body,
            ErrorCode.RESPONSE_FAILED,
            f"response incomplete with no output (reason: {reason or 'unknown'})",
        )
    if status == "failed":
        return Settled(
            status_text,
            response_body,
            ErrorCode.RESPONSE_FAILED,
            _error_message(response_body, "response failed without an error message"),
        )
    if status == "cancelled":
        return Settled(status_text, response_body, ErrorCode.CANCELLED, "response was cancelled")
    if status == "expired":
        return Settled(status_text, response_body, ErrorCode.EXPIRED, "response expired")
    # a status this code has never heard of is still an answer; surfacing it beats waiting forever
    return Settled(
        status_text,
        response_body,
        ErrorCode.RESPONSE_FAILED,
        f"unexpected response status {status!r}",
    )


class OpenAIBackground:
    """`BackgroundApi` for OpenAI and the providers that copy its Responses API."""

    def runs_in_background(self, request: Request) -> bool:
        return request.path in BACKGROUND_URLS

    def submit_request(self, request: Request) -> Request:
        return submit_request(request)

    def response_id(self, body: dict[str, Any]) -> str:
        return str(body.get("id"))

    def status(self, body: dict[str, Any]) -> str:
        return str(body.get("status"))

    def settle(self, body: dict[str, Any]) -> Settled | None:
        return settle(body)

    def poll_request(self, line: int, custom_id: str, response_id: str) -> Request:
        return poll_request(line, custom_id, response_id)

    def cancel_request(self, line: int, custom_id: str, response_id: str) -> Request:
        return cancel_request(line, custom_id, response_id)

    def ended(self, body: Any) -> bool:
        return isinstance(body, dict) and body.get("status") in ENDED_STATUSES
