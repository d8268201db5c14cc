"""Where the response cache lives: named blobs under one root, in the job bucket or a directory.

Deployed, the root is the job bucket's `cache/` (encrypted like the rest of it, expired by its own
lifecycle rule); locally (`sluice run`) a directory, whose segments take answers one `append` at a
time, so that a run killed with SIGKILL keeps every answer it got. S3 objects are written whole.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from sluice.contract import CACHE_PREFIX, Settings, causes
from sluice.core.aws_errors import is_missing

SEGMENTS = "segments/"
INDEXES = "index/"


class Listed(NamedTuple):
    """One name under a folder: an object, with its size and when it was last written (epoch
    seconds), or a sub-folder (its name ends with `/`, size and time 0)."""

    name: str
    size: int = 0
    modified: float = 0.0


class CacheStore(Protocol):
    def listing(self, folder: str, *, recursive: bool = False) -> list[Listed]: ...
    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None: ...
    def write(self, name: str, data: bytes) -> None: ...
    def delete(self, names: list[str]) -> None: ...


class Appender(Protocol):
    def add(self, row: bytes) -> int: ...
    def close(self) -> None: ...


@dataclass
class S3Store:
    """The job bucket under `cache/`."""

    s3: Any
    bucket: str
    prefix: str = CACHE_PREFIX

    @causes.under(causes.PLAN, causes.COMPACT, causes.USER)
    def listing(self, folder: str, *, recursive: bool = False) -> list[Listed]:
        out: list[Listed] = []
        paginator = self.s3.get_paginator("list_objects_v2")
        extra = {} if recursive else {"Delimiter": "/"}
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + folder, **extra):
            for obj in page.get("Contents", []):
                name = obj["Key"].removeprefix(self.prefix)
                out.append(Listed(name, int(obj["Size"]), obj["LastModified"].timestamp()))
            out.extend(Listed(p["Prefix"].removeprefix(self.prefix)) for p in page.get("CommonPrefixes", []))
        return sorted(out)

    @causes.under(causes.CACHE_READ, causes.COMPACT)
    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
        extra = {"Range": f"bytes={start}-{end - 1}"} if start is not None and end is not None else {}
        try:
            return bytes(self.s3.get_object(Bucket=self.bucket, Key=self.prefix + name, **extra)["Body"].read())
        except Exception as exc:
            # expired by the lifecycle rule, or removed by a compaction or `cache clear`: a miss
            if is_missing(exc):
                return None
            raise

    @causes.under(causes.CACHE_WRITE, causes.COMPACT)
    def write(self, name: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data)

    @causes.under(causes.COMPACT, causes.USER)
    def delete(self, names: list[str]) -> None:
        for start in range(0, len(names), 1000):
            chunk = [{"Key": self.prefix + n} for n in names[start : start + 1000]]
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})


class _FileAppender:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._offset = os.fstat(self._fd).st_size

    def add(self, row: bytes) -> int:
        # one write per answer: the kernel has it the moment it returns, so a SIGKILL loses none
        offset = self._offset
        os.write(self._fd, row)
        self._offset += len(row)
        return offset

    def close(self) -> None:
        os.close(self._fd)


@dataclass
class DirStore:
    """A directory on this machine (`sluice run`); files readable by the user only."""

    root: Path

    def listing(self, folder: str, *, recursive: bool = False) -> list[Listed]:
        where = self.root / folder
        if not where.is_dir():
            return []
        out: list[Listed] = []
        for path in where.iterdir():
            # a dot file is a write in progress (`write`)
            if path.name.startswith("."):
                continue
            name = folder + path.name
            if path.is_dir():
                out.extend(self.listing(name + "/", recursive=True) if recursive else [Listed(name + "/")])
            elif path.is_file():
                stat = path.stat()
                out.append(Listed(name, stat.st_size, stat.st_mtime))
        return sorted(out)

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
        try:
            with (self.root / name).open("rb") as fh:
                if start is None or end is None:
                    return fh.read()
                fh.seek(start)
                return fh.read(end - start)
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        target = self.root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        # whole or not at all: a reader never sees half an index
        temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temp, target)

    def delete(self, names: list[str]) -> None:
        for name in names:
            (self.root / name).unlink(missing_ok=True)
        # a compacted generation's folder goes with its last object
        for folder in {(self.root / n).parent for n in names}:
            if folder != self.root and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()

    def append(self, name: str) -> Appender:
        return _FileAppender(self.root / name)


def default_cache_dir() -> Path:
    """Where `sluice run` keeps answers: `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluice"


def cache_store(s3: Any, settings: Settings) -> CacheStore:
    """The local directory when the settings name one, else the job bucket."""
    if settings.cache_dir:
        return DirStore(Path(settings.cache_dir))
    return S3Store(s3, settings.bucket)
