"""The batch turnarounds measured by local runs, kept between them in the cache directory.

Each `sluice run` stands up a fresh local cloud, whose bucket would forget what Merge kept there
(`sluice.plan.turnarounds`). So a run seeds the bucket's `turnarounds/` from the directory before
its job and copies it back after, and `sluice estimate --deadline` reads the directory itself. A
run on the built-in simulator keeps its figures apart (`SIMULATOR_DIR`): its batches take a
fraction of a second, which says nothing of how long a provider's take.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import orjson
from sluice.contract import TURNAROUNDS_PREFIX, turnarounds_key
from sluice.plan.turnarounds import parse_turnarounds

# under the cache directory: what runs on the built-in simulator measured
SIMULATOR_DIR = "sluice-simulator"


class Bucket(Protocol):
    def read(self, key: str) -> bytes: ...

    def write(self, key: str, body: bytes) -> None: ...

    def keys(self, prefix: str) -> list[str]: ...


def turnarounds_root(cache_dir: Path, *, simulated: bool) -> Path:
    """The directory a bucket's `turnarounds/` is mirrored under (the objects at their keys' paths)."""
    return cache_dir / SIMULATOR_DIR if simulated else cache_dir


def seed(bucket: Bucket, root: Path) -> int:
    """Every figure kept under `root` put into the bucket, before the job's Plan can read them; how many objects."""
    found = sorted((root / TURNAROUNDS_PREFIX).rglob("*.json")) if (root / TURNAROUNDS_PREFIX).is_dir() else []
    for path in found:
        bucket.write(path.relative_to(root).as_posix(), path.read_bytes())
    return len(found)


def copy_back(bucket: Bucket, root: Path) -> list[Path]:
    """What the job's Merge wrote to the bucket's `turnarounds/`, written under `root`; the files changed."""
    changed: list[Path] = []
    for key in bucket.keys(TURNAROUNDS_PREFIX):
        body = bucket.read(key)
        target = root / key
        if target.is_file() and target.read_bytes() == body:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(body)
        # whole or not at all: a run stopped mid-write leaves the earlier figures
        partial.replace(target)
        changed.append(target)
    return changed


def read_local(root: Path, family: str, model: str | None) -> list[float]:
    """The figures local runs measured of `family`'s `model`; none when they measured none."""
    if not model:
        return []
    path = root / turnarounds_key(family, model)
    try:
        data: Any = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return []
    return parse_turnarounds(data)
