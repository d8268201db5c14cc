"""The response cache: a provider's successful answer, kept by what was asked, so it is paid once.

A line's key is the SHA-256 of the provider's base URL, the endpoint and the request body as
sent (after the job's model overrides), in canonical JSON (sorted keys): two lines that ask the
same thing of the same provider share an answer, whatever the job, the mode or the key order.
The value is the answer's `response` object exactly as a result line carries it (status code,
request id, body), kept inside that result line in S3: never a header, never an API key.

Storage is segments plus indexes, in one `CacheStore` with two backends: the job bucket under
`cache/` (deployed) or a directory (local runs). A shard run writes one segment per 5,000
answers and one index (`index/<name>.idx`: 16 bytes of key, line tag, segment, offset, length,
and the answer's model and tokens per row, so a hit's saving is counted without parsing it).
Plan reads the indexes only, a few GETs whatever the job's size, resolves each line's key
against them, and fetches the hits with one ranged GET per segment; no request per line on any
path.

A segment in S3 (`segments/<name>.jsonl`) is the answers' result lines, the bytes the shard
writes to its own part anyway: filing an answer copies it once and packs its index row, which
keeps a cold run's cost close to a run without the cache. A local segment
(`segments/<name>.seg`: `<key hex>\t<line tag hex>\t<response>` rows) is appended to as each
answer arrives (one `os.write`), so a run killed with SIGKILL loses no answer; its index is
rebuilt from its rows, which carry their keys, by the next reader.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import orjson

from .contract import CACHE_PREFIX, Settings
from .model import Outcome, Request
from .shard import ShardContext, ShardSpec, read_shard
from .stats import usage_tokens

SEGMENTS = "segments/"
INDEXES = "index/"
SEGMENT_SUFFIX = ".seg"
# a segment written whole: result lines, its keys in its index only
RECORDS_SUFFIX = ".jsonl"
INDEX_SUFFIX = ".idx"
INDEX_MAGIC = b"SLUICE-CACHE-INDEX 2\n"
# the first release's indexes, without the answers' usage: still read, the usage then parsed
INDEX_MAGIC_V1 = b"SLUICE-CACHE-INDEX 1\n"
# key (16 bytes), line tag, segment, offset, length; from version 2 the answer's model and tokens
_ENTRY_V1 = struct.Struct("<16s8sIII")
_ENTRY = struct.Struct("<16s8sIIIHII")
_UNKNOWN_MODEL = 0xFFFF
_COUNT = struct.Struct("<I")
_NAME_LEN = struct.Struct("<H")
# Plan folds the indexes into one once there are this many: a job's few dozen parts each add one
COMPACT_AT = 64
KEY_BYTES = 32
# answers per segment a shard writes to S3: one per 5,000-line shard run, so a re-run of the
# job fetches its hits with about one ranged GET per shard
SEGMENT_ROWS = 5000
TAG_BYTES = 8
# a row: `<key hex>\t<tag hex>\t<response>\n`
_ANSWER_AT = KEY_BYTES * 2 + 1 + TAG_BYTES * 2 + 1


def canonical_body(body: bytes) -> bytes:
    return orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)


@functools.lru_cache(maxsize=64)
def _asked_of(base_url: str, path: str) -> bytes:
    """Whom a line asks, which every line of a job shares."""
    return base_url.rstrip("/").encode() + b"\n" + path.encode() + b"\n"


def cache_key(base_url: str, path: str, body: bytes | None, *, canonical: bool = False) -> bytes:
    """What a line asks, and of whom: base URL, endpoint, canonical body (`canonical`: it already is)."""
    asked = _asked_of(base_url, path)
    if body:
        asked += body if canonical else canonical_body(body)
    # one call per line: a filling shard hashes every request it sends
    return hashlib.sha256(asked).digest()


def filed_usage(
    outcome: Outcome, *, keep_incomplete: bool, usage: tuple[str, int, int] | None = None
) -> tuple[str, int, int] | None:
    """What the index keeps of an answer the cache may keep, (model, tokens in, tokens out); None
    for any other. The cache keeps a provider's 200 answer, finished, or cut short (a response
    `incomplete`, a completion stopped by its token limit) when the job asks for those too.
    `usage`: what the shard's figures already read of the body (`Stats.add_outcome`)."""
    body = outcome.body
    if not outcome.ok or outcome.status_code != 200 or not isinstance(body, dict):
        return None
    get = body.get
    status = get("status")
    if status is not None and status != "completed" and (status != "incomplete" or not keep_incomplete):
        return None
    choices = get("choices")
    if not keep_incomplete and isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and choice.get("finish_reason") == "length":
                return None
    return usage or answer_usage(body)


def line_tag(custom_id: str) -> bytes:
    """Which line an answer was for. Lines asking the same thing share answers, but a re-run
    gets back its own line's answer (its ids too), so it is byte for byte the first run."""
    return hashlib.blake2b(custom_id.encode(), digest_size=TAG_BYTES).digest()


def cache_row(key: bytes, tag: bytes, answer: bytes) -> bytes:
    return key.hex().encode() + b"\t" + tag.hex().encode() + b"\t" + answer + b"\n"


_RESPONSE = b',"response":'
_RECORD_END = b',"error":null}'


def answer_of(record: bytes) -> bytes:
    """The `response` object inside a result line `records.result_record` wrote. Its first
    `,"response":` is the key: inside the custom_id before it a quote would be escaped."""
    return record[record.index(_RESPONSE) + len(_RESPONSE) : -len(_RECORD_END)]


def cached_record(record_id: str, custom_id: str, answer: bytes) -> bytes:
    """A result line answered from the cache: the line a sent request would have had, plus `cached`."""
    return b'{"id":%s,"custom_id":%s,"response":%s,"error":null,"cached":true}' % (
        orjson.dumps(record_id),
        orjson.dumps(custom_id),
        answer,
    )


# --- storage --------------------------------------------------------------------------------


class CacheStore(Protocol):
    """Named blobs under one root. A `DirStore` also takes answers one `append` at a time, so a
    killed local run keeps each answer it got; S3 objects are written whole."""

    def names(self, folder: str) -> list[str]: ...
    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None: ...
    def write(self, name: str, data: bytes) -> None: ...
    def delete(self, names: list[str]) -> None: ...
    def size(self) -> tuple[int, int]: ...


class Appender(Protocol):
    def add(self, row: bytes) -> int: ...
    def close(self) -> None: ...


@dataclass
class S3Store:
    """The job bucket under `cache/`: encrypted like the rest of it, expired by its own lifecycle rule."""

    s3: Any
    bucket: str
    prefix: str = CACHE_PREFIX

    def names(self, folder: str) -> list[str]:
        out: list[str] = []
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + folder):
            out.extend(obj["Key"].removeprefix(self.prefix) for obj in page.get("Contents", []))
        return sorted(out)

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
        extra = {"Range": f"bytes={start}-{end - 1}"} if start is not None and end is not None else {}
        try:
            return bytes(self.s3.get_object(Bucket=self.bucket, Key=self.prefix + name, **extra)["Body"].read())
        except Exception as exc:
            # expired by the lifecycle rule, or removed by a compaction or `cache clear`: a miss
            if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise

    def write(self, name: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self.prefix + name, Body=data)

    def delete(self, names: list[str]) -> None:
        for start in range(0, len(names), 1000):
            chunk = [{"Key": self.prefix + n} for n in names[start : start + 1000]]
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})

    def size(self) -> tuple[int, int]:
        count = total = 0
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
            for obj in page.get("Contents", []):
                count += 1
                total += int(obj["Size"])
        return count, total


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

    def names(self, folder: str) -> list[str]:
        where = self.root / folder
        if not where.is_dir():
            return []
        return sorted(folder + p.name for p in where.iterdir() if p.is_file() and not p.name.startswith("."))

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
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(temp, target)

    def delete(self, names: list[str]) -> None:
        for name in names:
            (self.root / name).unlink(missing_ok=True)

    def append(self, name: str) -> Appender:
        return _FileAppender(self.root / name)

    def size(self) -> tuple[int, int]:
        count = total = 0
        for folder in (SEGMENTS, INDEXES):
            for name in self.names(folder):
                count += 1
                total += (self.root / name).stat().st_size
        return count, total


def default_cache_dir() -> Path:
    """Where `sluice run` keeps answers: `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluice"


def cache_store(s3: Any, settings: Settings) -> CacheStore:
    """The local directory when the settings name one, else the job bucket."""
    if settings.cache_dir:
        return DirStore(Path(settings.cache_dir))
    return S3Store(s3, settings.bucket)


# --- the index ------------------------------------------------------------------------------


class Ref(NamedTuple):
    """Where an answer is; a tuple, as Plan makes one for every line that hits."""

    segment: str
    offset: int
    length: int
    tag: bytes = bytes(TAG_BYTES)
    # what the answer used, so a hit's saving is counted without parsing it; None: not known
    # (an index of the first release), "" for an answer that names no model
    model: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0


def answer_usage(body: Any) -> tuple[str, int, int]:
    """(model, input tokens, output tokens) of an answer's body, as the index keeps them."""
    model = body.get("model") if isinstance(body, dict) else None
    return (model, *usage_tokens(body)) if isinstance(model, str) else ("", 0, 0)


def _names(data: bytes, at: int) -> tuple[list[str], int]:
    (count,) = _COUNT.unpack_from(data, at)
    at += _COUNT.size
    names: list[str] = []
    for _ in range(count):
        (length,) = _NAME_LEN.unpack_from(data, at)
        at += _NAME_LEN.size
        names.append(data[at : at + length].decode())
        at += length
    return names, at


def _encode_names(names: Iterable[str]) -> bytes:
    encoded = [n.encode() for n in names]
    return _COUNT.pack(len(encoded)) + b"".join(_NAME_LEN.pack(len(n)) + n for n in encoded)


def encode_index(entries: Iterable[tuple[bytes, Ref]]) -> bytes:
    segments: dict[str, int] = {}
    models: dict[str, int] = {}
    rows: list[bytes] = []
    for key, ref in entries:
        number = segments.setdefault(ref.segment, len(segments))
        model = _UNKNOWN_MODEL if ref.model is None else models.setdefault(ref.model, len(models))
        rows.append(
            _ENTRY.pack(key[:16], ref.tag, number, ref.offset, ref.length, model, ref.tokens_in, ref.tokens_out)
        )
    return _index_bytes(segments, models, len(rows), b"".join(rows))


def _index_bytes(segments: Iterable[str], models: Iterable[str], count: int, rows: bytes) -> bytes:
    """An index: its header (segment and model names, row count), then `count` packed rows."""
    return INDEX_MAGIC + _encode_names(segments) + _encode_names(models) + _COUNT.pack(count) + rows


@dataclass(frozen=True, slots=True)
class _Table:
    """One index as read: its rows stay packed, and are decoded only for the lines that hit."""

    segments: list[str]
    models: list[str]
    body: memoryview
    rows: int
    entry: struct.Struct

    @classmethod
    def parse(cls, data: bytes) -> _Table | None:
        if data.startswith(INDEX_MAGIC):
            entry = _ENTRY
        elif data.startswith(INDEX_MAGIC_V1):
            entry = _ENTRY_V1
        else:
            return None
        segments, at = _names(data, len(INDEX_MAGIC))
        models: list[str] = []
        if entry is _ENTRY:
            models, at = _names(data, at)
        (rows,) = _COUNT.unpack_from(data, at)
        at += _COUNT.size
        return cls(segments, models, memoryview(data)[at : at + rows * entry.size], rows, entry)

    def ref(self, row: int) -> Ref:
        fields = self.entry.unpack_from(self.body, row * self.entry.size)
        segment, offset, length = self.segments[fields[2]], fields[3], fields[4]
        if len(fields) == 5 or fields[5] == _UNKNOWN_MODEL:
            return Ref(segment, offset, length, fields[1])
        return Ref(segment, offset, length, fields[1], self.models[fields[5]], fields[6], fields[7])

    def keys(self, width: int) -> list[bytes]:
        """Each row's first `width` bytes: its key (16), or its key and line tag (24)."""
        body, size = self.body, self.entry.size
        return [bytes(body[at : at + width]) for at in range(0, self.rows * size, size)]


def decode_index(data: bytes) -> Iterator[tuple[bytes, Ref]]:
    table = _Table.parse(data)
    if table is None:
        return
    for row, key in enumerate(table.keys(16)):
        yield key, table.ref(row)


def segment_rows(data: bytes, segment: str) -> Iterator[tuple[bytes, Ref]]:
    """(key, ref) of each whole row; a row a kill cut short has no newline and is skipped.
    Only a segment a killed run left without an index is read this way: its answers are parsed."""
    at = 0
    while True:
        end = data.find(b"\n", at)
        if end < 0:
            return
        if end - at > _ANSWER_AT and data[at + _ANSWER_AT - 1] == 9:
            with contextlib.suppress(ValueError):
                key = bytes.fromhex(data[at : at + KEY_BYTES * 2].decode())
                tag = bytes.fromhex(data[at + KEY_BYTES * 2 + 1 : at + _ANSWER_AT - 1].decode())
                model, tokens_in, tokens_out = answer_usage(orjson.loads(data[at + _ANSWER_AT : end]).get("body"))
                yield key, Ref(segment, at, end + 1 - at, tag, model, tokens_in, tokens_out)
        at = end + 1


def _segment_of(index_name: str) -> str:
    return SEGMENTS + index_name.removeprefix(INDEXES).removesuffix(INDEX_SUFFIX) + SEGMENT_SUFFIX


@dataclass
class CacheIndex:
    """Every answer the store holds, by the first 16 bytes of its key (the row holds all 32).

    Loading builds two dicts straight from the packed rows, one by key and line tag (this
    line's own answer) and one by key (any line's answer to the same request), so Plan's
    cost is a dict lookup a line however many answers the cache holds.
    """

    store: CacheStore
    indexes: list[str] = field(default_factory=list)
    reads: int = 0
    _tables: list[_Table] = field(default_factory=list)
    _by_tag: dict[bytes, int] = field(default_factory=dict)
    _by_key: dict[bytes, int] = field(default_factory=dict)

    @classmethod
    def load(cls, store: CacheStore, *, compact_at: int = COMPACT_AT) -> CacheIndex:
        index = cls(store)
        index.indexes = store.names(INDEXES)
        indexed: set[str] = set()
        for name in index.indexes:
            data = store.read(name)
            index.reads += 1
            if data is not None:
                indexed.update(index._add_table(data))
        if isinstance(store, DirStore):
            # a local run killed mid-way left segments with no index: read them, and index them
            for segment in store.names(SEGMENTS):
                if segment in indexed or not segment.endswith(SEGMENT_SUFFIX):
                    continue
                data = store.read(segment) or b""
                encoded = encode_index(segment_rows(data, segment))
                name = INDEXES + segment.removeprefix(SEGMENTS).removesuffix(SEGMENT_SUFFIX) + INDEX_SUFFIX
                store.write(name, encoded)
                index._add_table(encoded)
                index.indexes.append(name)
        if len(index.indexes) >= compact_at:
            index.compact()
        return index

    def _add_table(self, data: bytes) -> list[str]:
        table = _Table.parse(data)
        if table is None:
            return []
        base = len(self._tables) << 32
        self._tables.append(table)
        ids = range(base, base + table.rows)
        self._by_tag.update(zip(table.keys(16 + TAG_BYTES), ids, strict=True))
        self._by_key.update(zip(table.keys(16), ids, strict=True))
        return table.segments

    def _ref(self, entry: int) -> Ref:
        return self._tables[entry >> 32].ref(entry & 0xFFFFFFFF)

    def entries(self) -> Iterator[tuple[bytes, Ref]]:
        """(key, ref) of each answer: one a line tag per request."""
        for key, entry in self._by_tag.items():
            yield key[:16], self._ref(entry)

    def compact(self) -> None:
        """Fold every index read into one, so the next Plan reads one object instead of many."""
        name = f"{INDEXES}compact-{time.time_ns():020d}-{secrets.token_hex(4)}{INDEX_SUFFIX}"
        self.store.write(name, encode_index(self.entries()))
        self.store.delete([n for n in self.indexes if n != name])
        self.indexes = [name]

    def find(self, key: bytes, tag: bytes) -> Ref | None:
        """This line's own answer if the cache has it, else any line's answer to the same request."""
        entry = self._by_tag.get(key[:16] + tag)
        if entry is None:
            entry = self._by_key.get(key[:16])
            if entry is None:
                return None
        return self._ref(entry)

    @property
    def requests(self) -> int:
        """Distinct requests answered (lines asking the same thing count once)."""
        return len(self._by_key)

    def __len__(self) -> int:
        return len(self._by_tag)

    def fetch(self, wanted: Iterable[tuple[int, bytes, Ref]]) -> Iterator[tuple[int, bytes]]:
        """(line, response) for each wanted (line, key, ref) whose row is still there and is its key.

        One read per segment, from its first wanted row to the end of its last.
        """
        by_segment: dict[str, list[tuple[int, bytes, Ref]]] = {}
        for entry in wanted:
            by_segment.setdefault(entry[2].segment, []).append(entry)
        for segment, entries in by_segment.items():
            start = min(ref.offset for _, _, ref in entries)
            end = max(ref.offset + ref.length for _, _, ref in entries)
            data = self.store.read(segment, start, end)
            self.reads += 1
            if data is None:
                continue
            records = segment.endswith(RECORDS_SUFFIX)
            for line, key, ref in entries:
                row = data[ref.offset - start : ref.offset - start + ref.length]
                if len(row) != ref.length or not row.endswith(b"\n"):
                    continue
                if not records:
                    if row[: KEY_BYTES * 2] == key.hex().encode():
                        yield line, row[_ANSWER_AT:-1]
                elif row.startswith(b"{") and row.endswith(_RECORD_END + b"\n") and _RESPONSE in row:
                    yield line, answer_of(row[:-1])


# --- filling --------------------------------------------------------------------------------


@dataclass
class FilledSegment:
    """Answers on their way to one segment: its bytes, and its index rows already packed
    (segment number 0), so nothing is kept per answer but bytes."""

    rows: bytearray = field(default_factory=bytearray)
    entries: bytearray = field(default_factory=bytearray)
    models: dict[str, int] = field(default_factory=dict)
    count: int = 0

    def add(self, key: bytes, tag: bytes, offset: int, length: int, usage: tuple[str, int, int]) -> None:
        model, tokens_in, tokens_out = usage
        number = self.models.setdefault(model, len(self.models))
        # the struct keeps the key's first 16 bytes
        self.entries += _ENTRY.pack(key, tag, 0, offset, length, number, tokens_in, tokens_out)
        self.count += 1

    def index(self, segment: str) -> bytes:
        """The index of this segment, as `encode_index` would write it from the same rows."""
        return _index_bytes([segment], self.models, self.count, bytes(self.entries))


class CacheFill:
    """What a shard's writer does with each answer: file it under its line's key.

    Keys come from `track` as requests go out; lines answered in a later step (a batch, a
    background response) get theirs from one re-read of the shard, when the first one arrives.
    Each answer becomes a row of bytes and a packed index row as it comes: the shard's live
    objects stay the engine's own, so the collector has no more to scan with the cache on.
    """

    def __init__(
        self,
        store: CacheStore,
        *,
        base_url: str,
        name: str,
        keep_incomplete: bool = False,
        keys_for: Any = None,
        canonical: bool = False,
    ) -> None:
        self._store = store
        # a local store's segment is appended to answer by answer
        self._dir = store if isinstance(store, DirStore) else None
        # the requests' bodies come with their keys sorted (`shard.read_shard` for a filling job)
        self._canonical = canonical
        self._base_url = base_url
        self._name = name
        self._keep_incomplete = keep_incomplete
        self._keys: dict[int, bytes | None] = {}
        self._keys_for = keys_for
        self._read_shard = False
        self._filling = FilledSegment()
        self._appender: Appender | None = None
        self._segment = f"{SEGMENTS}{name}{SEGMENT_SUFFIX}"
        self._parts = 0

    def track(self, requests: Iterable[Request]) -> Iterator[Request]:
        keys, key = self._keys, self.key
        for request in requests:
            keys[request.line] = key(request)
            yield request

    def key(self, request: Request) -> bytes | None:
        return (
            cache_key(self._base_url, request.path, request.body, canonical=self._canonical) if request.cache else None
        )

    def _key_of(self, line: int) -> bytes | None:
        if line not in self._keys and not self._read_shard and self._keys_for is not None:
            self._read_shard = True
            for request in self._keys_for():
                self._keys.setdefault(request.line, self.key(request))
        return self._keys.pop(line, None)

    def add(self, outcome: Outcome, record: bytes, usage: tuple[str, int, int] | None = None) -> None:
        """File `outcome`'s answer; `record` is its result line, as the shard writes it; `usage`
        its model and tokens, if already read."""
        usage = filed_usage(outcome, keep_incomplete=self._keep_incomplete, usage=usage)
        if usage is None:
            self._keys.pop(outcome.line, None)
            return
        key = self._key_of(outcome.line)
        if key is None:
            return
        tag = line_tag(outcome.custom_id)
        filling = self._filling
        if self._dir is None:
            offset = len(filling.rows)
            filling.rows += record
            filling.rows += b"\n"
            filling.add(key, tag, offset, len(record) + 1, usage)
            return
        if self._appender is None:
            self._appender = self._dir.append(self._segment)
        row = cache_row(key, tag, answer_of(record))
        filling.add(key, tag, self._appender.add(row), len(row), usage)

    def cut(self, *, last: bool = False) -> FilledSegment | None:
        """One segment's answers, written with the part being cut (stores written whole): every
        `SEGMENT_ROWS` answers, and what is left at the end of the run. Parts are cut every few
        seconds; a segment per part would make a re-run's Plan fetch from hundreds of them.
        A run that dies loses the answers not yet in a segment: their lines are sent again by a
        later job, never lost."""
        if self._appender is not None or self._filling.count == 0:
            return None
        if not last and self._filling.count < SEGMENT_ROWS:
            return None
        filled, self._filling = self._filling, FilledSegment()
        return filled

    def write(self, filled: FilledSegment | None) -> None:
        """One segment and its index, segment first: an index never names what is not there."""
        if filled is None:
            return
        self._parts += 1
        name = f"{self._name}-{self._parts:04d}"
        segment = f"{SEGMENTS}{name}{RECORDS_SUFFIX}"
        self._store.write(segment, bytes(filled.rows))
        self._store.write(f"{INDEXES}{name}{INDEX_SUFFIX}", filled.index(segment))

    def close(self) -> None:
        if self._appender is not None:
            self._appender.close()
            self._appender = None
            name = self._segment.removeprefix(SEGMENTS).removesuffix(SEGMENT_SUFFIX)
            self._store.write(f"{INDEXES}{name}{INDEX_SUFFIX}", self._filling.index(self._segment))


def segment_name(job_id: str, shard: int, run: int, path: str) -> str:
    return f"{job_id}.{shard:05d}.{run:05d}.{path}.{secrets.token_hex(4)}"


def clear(store: CacheStore) -> int:
    names = store.names(INDEXES) + store.names(SEGMENTS)
    store.delete(names)
    return len(names)


def stats(store: CacheStore) -> dict[str, int]:
    index = CacheIndex.load(store, compact_at=1 << 30)
    objects, size = store.size()
    return {"answers": len(index), "requests": index.requests, "objects": objects, "bytes": size}


def fill_for(ctx: ShardContext, spec: ShardSpec, *, run: int, path: str) -> CacheFill | None:
    """The cache a shard's writer fills, when its job writes to the cache."""
    if not spec.fills_cache:
        return None

    def keys_for() -> Iterator[Request]:
        return (item for item in read_shard(ctx.s3, spec) if isinstance(item, Request))

    return CacheFill(
        cache_store(ctx.s3, ctx.settings),
        base_url=ctx.settings.cache_provider_name,
        name=segment_name(spec.job_id, spec.shard, run, path),
        keep_incomplete=spec.cache_incomplete,
        keys_for=keys_for,
        # `read_shard` sorted the bodies' keys, as it does for every job that fills the cache
        canonical=True,
    )
