"""The simulator on its own thread and event loop, for tests, local runs and benchmarks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from sluice_local.simulator.app import SIM_KEY, Simulator, start
from sluice_local.simulator.config import SimConfig

_T = TypeVar("_T")


class SimulatorServer:
    """The simulator on its own thread and event loop, for tests and local runs.

    with SimulatorServer(SimConfig(latency_s=0.01)) as sim:
        client = OpenAI(base_url=sim.base_url, api_key="x")
    """

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._initial = config or SimConfig()
        self._clock = clock  # of the rate limits; None: the event loop's
        self.host = host
        self._requested_port = port
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> SimulatorServer:
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name="sluice-simulator", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise RuntimeError("simulator failed to start") from self._error
        if self._port is None:
            raise RuntimeError("simulator did not start in time")
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            self._runner, self._port = loop.run_until_complete(
                start(self._initial, self.host, self._requested_port, clock=self._clock)
            )
        except BaseException as exc:  # handed to the starting thread
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._runner.cleanup())
            # answers a client gave up on (an interrupted run) are still being prepared: end them
            # here, or closing the loop reports each as a task destroyed while pending
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("simulator not started")
        return self._port

    @property
    def url(self) -> str:
        """The root URL (admin endpoints live under /sim)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as base_url."""
        return f"{self.url}/v1"

    @property
    def simulator(self) -> Simulator:
        if self._runner is None:
            raise RuntimeError("simulator not started")
        return self._runner.app[SIM_KEY]

    def call(self, fn: Callable[[Simulator], _T]) -> _T:
        """Run `fn(simulator)` on the simulator's loop and return its result."""
        if self._loop is None:
            raise RuntimeError("simulator not started")
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        sim = self.simulator

        def run() -> None:
            try:
                future.set_result(fn(sim))
            except BaseException as exc:  # re-raised in the calling thread
                future.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout=30)

    @property
    def config(self) -> SimConfig:
        return self.simulator.config

    def configure(self, **changes: Any) -> SimConfig:
        return self.call(lambda sim: sim.update_config(changes))

    @property
    def log(self) -> list[dict[str, Any]]:
        return self.call(lambda sim: [dict(e) for e in sim.log])

    def clear_log(self) -> None:
        self.call(lambda sim: sim.log.clear())

    @property
    def webhooks(self) -> list[dict[str, Any]]:
        return self.call(lambda sim: [dict(e, deliveries=list(e["deliveries"])) for e in sim.webhook_log])

    def reset(self) -> None:
        self.call(lambda sim: sim.reset())
