"""The request log: one entry per /v1 request, with what the handlers learned about it."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from sluice_local.simulator.wire import CUSTOM_ID_HEADER

# what a handler learned about a request (fault, attempt, custom id, ...) for the request log
NOTES = web.RequestKey("sluice_simulator_notes", dict[str, Any])


def entry(request: web.Request, started: float, status: int | None, request_id: str) -> dict[str, Any]:
    """The log entry of a finished request (status None: the connection was dropped)."""
    notes = request[NOTES]
    logged = {
        "t": started,
        "method": request.method,
        "path": request.path,
        "custom_id": request.headers.get(CUSTOM_ID_HEADER) or notes.pop("custom_id", None),
        "status": status,
        "fault": notes.pop("fault", None),
        "attempt": notes.pop("attempt", None),
        # the tier an OpenAI inference request was served at ("default", "flex"); None for any other
        "service_tier": notes.pop("service_tier", None),
        "request_id": request_id,
    }
    logged.update(notes)
    return logged
