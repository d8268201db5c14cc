"""Fixtures of the unit tests: the provider simulator that the simulator's own tests share, one per
module (`server`), reset and set to `sim_client.BASE` for each test (`sim`). A module that defines
its own `sim` uses that one."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from sluice_local.simulator import SimulatorServer
from tests.unit.sim_client import BASE


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(BASE) as running:
        yield running


@pytest.fixture
def sim(server: SimulatorServer) -> SimulatorServer:
    server.reset()
    server.configure(**dataclasses.asdict(BASE))
    return server
