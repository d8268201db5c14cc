"""What test_batch.py and the tests beside it share."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from sluice_local.simulator import SimulatorServer
from tests.conftest import request_line


def lines(count: int, prefix: str = "q") -> list[bytes]:
    return [request_line(f"{prefix}-{n}", "great value" if n % 2 else "awful, broke at once") for n in range(count)]


def batch_creates(simulator: SimulatorServer) -> list[dict[str, Any]]:
    return [e for e in simulator.log if e["method"] == "POST" and e["path"] == "/v1/batches"]


def sent_directly(simulator: SimulatorServer) -> Counter[str]:
    log = simulator.log
    return Counter(e["custom_id"] for e in log if e["method"] == "POST" and e["path"] == "/v1/chat/completions")


def returned_by_batches(simulator: SimulatorServer) -> Counter[str]:
    """custom_ids the provider answered in a batch output file."""

    def read(sim: Any) -> list[str]:
        found: list[str] = []
        for batch in sim.batches.values():
            if batch.output_file_id:
                stored = sim.files.get(batch.output_file_id) or sim.deleted_files[batch.output_file_id]
                found.extend(orjson.loads(r)["custom_id"] for r in stored.content.splitlines())
        return found

    return Counter(simulator.call(read))


def ids(records: list[dict[str, Any]]) -> list[str]:
    return [r["custom_id"] for r in records]
