"""A provider's background responses as background mode uses them: the request that starts one, the
poll that reads it, and what a poll's body says (settled or not, and how).

The runners (`sluice.runners.background`) send these requests with the engine like any other, so a
`BackgroundApi` only shapes requests and reads bodies: it holds no client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sluice.contract.model import Request


@dataclass(frozen=True, slots=True)
class Settled:
    """A terminal background response: either a result (`error_code is None`) or an error."""

    status: str
    body: dict[str, Any]
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_code is None


class BackgroundApi(Protocol):
    def runs_in_background(self, request: Request) -> bool:
        """Whether `request`'s endpoint has a background form (the others are sent directly)."""
        ...

    def submit_request(self, request: Request) -> Request:
        """The request that starts `request` in the background, every field of its body kept."""
        ...

    def response_id(self, body: dict[str, Any]) -> str:
        """The id of the response a submit's answer created."""
        ...

    def status(self, body: dict[str, Any]) -> str:
        """The response's status as the provider words it (for messages)."""
        ...

    def settle(self, body: dict[str, Any]) -> Settled | None:
        """None while the response is still queued or running; otherwise how it ended."""
        ...

    def poll_request(self, line: int, custom_id: str, response_id: str) -> Request: ...

    def cancel_request(self, line: int, custom_id: str, response_id: str) -> Request: ...

    def ended(self, body: Any) -> bool:
        """Whether a poll's body shows the response ended (or being cancelled): a refused cancel
        of it is no failure."""
        ...
