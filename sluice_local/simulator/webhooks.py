"""The webhooks the simulator sends: Standard Webhooks events, signed, dropped, duplicated or late on purpose."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from sluice_local.simulator.config import SimConfig
from sluice_local.simulator.core import Core
from sluice_local.simulator.faults import draws
from sluice_local.simulator.wire import SERVER_HEADER


class Webhooks:
    """Sends response.* and batch.* events to config.webhook_url and logs every delivery."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self.log: deque[dict[str, Any]] = deque(maxlen=core.config.log_limit)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def resize(self, log_limit: int) -> None:
        self.log = deque(self.log, maxlen=log_limit)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def emit(self, event_type: str, object_id: str) -> None:
        cfg = self._core.config
        if not cfg.webhook_url:
            return
        u_drop, u_dup, _ = draws(cfg.seed, f"webhook:{event_type}:{object_id}", 0)
        event = {
            "id": self._core.new_id("evt_sim"),
            "object": "event",
            "created_at": int(time.time()),
            "type": event_type,
            "data": {"id": object_id},
        }
        entry: dict[str, Any] = {
            "t": time.time(),
            "event_id": event["id"],
            "type": event_type,
            "data_id": object_id,
            "dropped": u_drop < cfg.webhook_drop_rate,
            "duplicate": u_dup < cfg.webhook_duplicate_rate,
            "deliveries": [],
        }
        self.log.append(entry)
        if entry["dropped"]:
            return
        task = asyncio.get_running_loop().create_task(self._deliver(cfg, event, entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, cfg: SimConfig, event: dict[str, Any], entry: dict[str, Any]) -> None:
        _, _, u_jitter = draws(cfg.seed, f"webhook:{event['type']}:{event['data']['id']}", 0)
        delay = cfg.webhook_delay_s + u_jitter * cfg.webhook_jitter_s
        if delay > 0:
            await asyncio.sleep(delay)
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        body = orjson.dumps(event).decode()
        for copy in range(2 if entry["duplicate"] else 1):
            for attempt in range(4):
                if attempt:
                    await asyncio.sleep(0.25 * 2 ** (attempt - 1))
                headers = webhook_headers(cfg.webhook_secret, str(event["id"]), body)
                try:
                    assert cfg.webhook_url is not None
                    async with self._session.post(cfg.webhook_url, data=body, headers=headers) as answer:
                        entry["deliveries"].append({"copy": copy, "status": answer.status, "t": time.time()})
                        if answer.status < 500 and answer.status != 429:
                            break
                except (TimeoutError, aiohttp.ClientError) as exc:
                    entry["deliveries"].append({"copy": copy, "status": None, "error": type(exc).__name__})


def webhook_headers(secret: str | None, event_id: str, body: str) -> dict[str, str]:
    """The Standard Webhooks headers of one delivery, signed when there is a secret."""
    now = datetime.now(tz=UTC)
    headers = {
        "content-type": "application/json",
        "user-agent": SERVER_HEADER,
        "webhook-id": event_id,
        "webhook-timestamp": str(int(now.timestamp())),
    }
    if secret:
        from standardwebhooks.webhooks import Webhook

        headers["webhook-signature"] = Webhook(secret).sign(event_id, now, body)
    return headers
