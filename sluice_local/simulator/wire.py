"""The HTTP shapes every part answers with: JSON bodies, OpenAI-style errors, Retry-After, RFC 3339
times, and the lines of a JSONL body."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

SERVER_HEADER = "sluice-simulator"
FINGERPRINT = "fp_sluice_simulator"
CUSTOM_ID_HEADER = "x-sluice-custom-id"


class ApiError(Exception):
    """An OpenAI-shaped error answer."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": type, "param": param, "code": code}}
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        return json_response(self.body, status=self.status, headers=self.headers)


class Dropped(Exception):
    """Raised by a handler to close the connection without an answer."""


def json_response(data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, headers=headers, content_type="application/json")


def not_found(kind: str, ident: str) -> ApiError:
    return ApiError(404, f"No {kind} found with id '{ident}'.", code="not_found")


def retry_headers(seconds: float) -> dict[str, str]:
    """Retry-After in whole seconds and retry-after-ms, both rounded up (a client waiting them is never early)."""
    millis = math.ceil(round(seconds * 1000, 6))
    return {"retry-after": str(max(1, math.ceil(millis / 1000))), "retry-after-ms": str(millis)}


async def read_json(request: web.Request) -> tuple[bytes, dict[str, Any]]:
    """The raw body and its JSON object; a 400 ApiError when it is not one."""
    raw = await request.read()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ApiError(400, "We could not parse the JSON body of your request.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    return raw, data


def rfc3339(epoch_s: float) -> str:
    """A time as RFC 3339 in UTC to the microsecond, ending in Z."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def jsonl_lines(content: bytes) -> Iterator[tuple[int, bool, Any]]:
    """The lines of a JSONL body that are not blank: (line number from 1, whether it parsed, its value)."""
    for number, raw_line in enumerate(content.splitlines(), start=1):
        if not raw_line.strip():
            continue
        try:
            yield number, True, orjson.loads(raw_line)
        except orjson.JSONDecodeError:
            yield number, False, None
