"""Job events on EventBridge, so users can chain work on a finished job."""

from __future__ import annotations

from typing import Any

import orjson

SOURCE = "sluice"


def publish(events: Any, *, bus: str, detail_type: str, detail: dict[str, Any]) -> None:
    answer = events.put_events(
        Entries=[
            {"Source": SOURCE, "DetailType": detail_type, "Detail": orjson.dumps(detail).decode(), "EventBusName": bus}
        ]
    )
    if answer.get("FailedEntryCount"):
        entry = answer["Entries"][0]
        raise RuntimeError(f"EventBridge refused {detail_type!r}: {entry.get('ErrorCode')} {entry.get('ErrorMessage')}")
