"""The cache's indexes as stored: level 0 (one small index per segment a shard run wrote) and
level 1 (every answer, hash-partitioned by key and sorted, under a published generation).

A row is 46 bytes: 16 bytes of key, the line tag, segment, offset, length, and the answer's
model and tokens, so a hit's saving is counted without parsing the answer. A level-0 index
(`index/<name>.idx`) numbers its segments and models itself. A generation (`index/gen-<id>/`)
numbers them once for all its partitions in its segment table, whose slots never move: a
segment that expired keeps its number with no name, so compaction never rewrites a row to
renumber it. Partition `p<hex>.rows` holds the rows whose keys start with those hex digits,
sorted by key and line tag; the manifest `index/gen-<id>.gen`, written last, publishes it.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from sluice.cache.blobs import INDEXES, SEGMENTS
from sluice.providers import RequestFormat

INDEX_SUFFIX = ".idx"
SEGMENT_SUFFIX = ".seg"
# a segment written whole: result lines, its keys in its index only
RECORDS_SUFFIX = ".jsonl"
INDEX_MAGIC = b"SLUICE-CACHE-INDEX 2\n"
# the first release's indexes, without the answers' usage: still read, the usage then parsed
INDEX_MAGIC_V1 = b"SLUICE-CACHE-INDEX 1\n"
SEGMENT_TABLE_MAGIC = b"SLUICE-CACHE-SEGMENTS 1\n"
# key (16 bytes), line tag, segment, offset, length; from version 2 the answer's model and tokens
ROW_V1 = struct.Struct("<16s8sIII")
ROW = struct.Struct("<16s8sIIIHII")
KEY_PART = 16
TAG_BYTES = 8
# key and line tag: what sorts a partition, and what makes a row a line's own answer
KEY_TAG = KEY_PART + TAG_BYTES
UNKNOWN_MODEL = 0xFFFF
KEY_BYTES = 32
_COUNT = struct.Struct("<I")
_NAME_LEN = struct.Struct("<H")
# a local segment's row: `<key hex>\t<tag hex>\t<response>\n`
ANSWER_AT = KEY_BYTES * 2 + 1 + TAG_BYTES * 2 + 1
GENERATION_SUFFIX = ".gen"
# S3's lifecycle rule removes an object at the first midnight (UTC) after its expiry, never
# before; Plan stops counting on an answer a day sooner, so a hit is never one S3 just removed
EXPIRY_MARGIN_S = 86_400


def expiry_cutoff(now: float, ttl_days: int) -> float:
    """Answers whose segment was written before this are gone, or about to be; 0 with no expiry."""
    return max(0.0, now - ttl_days * 86_400 + EXPIRY_MARGIN_S) if ttl_days else 0.0


def _names(data: bytes | memoryview, at: int) -> tuple[list[str], int]:
    (count,) = _COUNT.unpack_from(data, at)
    at += _COUNT.size
    names: list[str] = []
    for _ in range(count):
        (length,) = _NAME_LEN.unpack_from(data, at)
        at += _NAME_LEN.size
        names.append(bytes(data[at : at + length]).decode())
        at += length
    return names, at


def encode_names(names: Iterable[str]) -> bytes:
    encoded = [n.encode() for n in names]
    return _COUNT.pack(len(encoded)) + b"".join(_NAME_LEN.pack(len(n)) + n for n in encoded)


# --- level 0 ------------------------------------------------------------------------------------


class Ref(NamedTuple):
    """Where an answer is, and what it used: None for a model not known (an index of the first
    release), "" for an answer that names no model."""

    segment: str
    offset: int
    length: int
    tag: bytes = bytes(TAG_BYTES)
    model: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0


def answer_usage(body: Any, request_format: RequestFormat) -> tuple[str, int, int]:
    """(model, input tokens, output tokens) of an answer's body, as the index keeps them."""
    model = request_format.answered_model(body)
    if model is None:
        return "", 0, 0
    used = request_format.usage(body)
    return (model, used.tokens_in, used.tokens_out) if used is not None else (model, 0, 0)


def index_bytes(segments: Iterable[str], models: Iterable[str], count: int, rows: bytes) -> bytes:
    """A level-0 index: its header (segment and model names, row count), then `count` packed rows."""
    return INDEX_MAGIC + encode_names(segments) + encode_names(models) + _COUNT.pack(count) + rows


def encode_index(entries: Iterable[tuple[bytes, Ref]]) -> bytes:
    segments: dict[str, int] = {}
    models: dict[str, int] = {}
    rows: list[bytes] = []
    for key, ref in entries:
        number = segments.setdefault(ref.segment, len(segments))
        model = UNKNOWN_MODEL if ref.model is None else models.setdefault(ref.model, len(models))
        rows.append(ROW.pack(key[:KEY_PART], ref.tag, number, ref.offset, ref.length, model, *ref[5:]))
    return index_bytes(segments, models, len(rows), b"".join(rows))


@dataclass(frozen=True, slots=True)
class Level0:
    """One level-0 index as read: its rows stay packed until they are renumbered or looked at."""

    segments: list[str]
    models: list[str]
    body: bytes
    rows: int
    entry: struct.Struct

    @classmethod
    def parse(cls, data: bytes) -> Level0 | None:
        if data.startswith(INDEX_MAGIC):
            entry = ROW
        elif data.startswith(INDEX_MAGIC_V1):
            entry = ROW_V1
        else:
            return None
        segments, at = _names(data, len(INDEX_MAGIC))
        models: list[str] = []
        if entry is ROW:
            models, at = _names(data, at)
        (rows,) = _COUNT.unpack_from(data, at)
        at += _COUNT.size
        return cls(segments, models, data[at : at + rows * entry.size], rows, entry)

    def ref(self, row: int) -> Ref:
        fields = self.entry.unpack_from(self.body, row * self.entry.size)
        segment, offset, length = self.segments[fields[2]], fields[3], fields[4]
        if len(fields) == 5 or fields[5] == UNKNOWN_MODEL:
            return Ref(segment, offset, length, fields[1])
        return Ref(segment, offset, length, fields[1], self.models[fields[5]], fields[6], fields[7])

    def segment_rows(self) -> list[int]:
        """How many rows name each of its segments."""
        if len(self.segments) == 1:
            return [self.rows]
        counts = [0] * len(self.segments)
        for (segment,) in struct.iter_unpack(f"<{KEY_TAG}xI{self.entry.size - KEY_TAG - 4}x", self.body):
            counts[segment] += 1
        return counts

    def renumbered(self, segments: list[int], models: list[int]) -> Iterator[bytes]:
        """Each row in the level-1 layout, its segment and model numbered as `segments` and
        `models` map this index's own numbers."""
        pack = ROW.pack
        if self.entry is ROW_V1:
            for key, tag, segment, offset, length in ROW_V1.iter_unpack(self.body):
                yield pack(key, tag, segments[segment], offset, length, UNKNOWN_MODEL, 0, 0)
            return
        for key, tag, segment, offset, length, model, tokens_in, tokens_out in ROW.iter_unpack(self.body):
            number = UNKNOWN_MODEL if model == UNKNOWN_MODEL else models[model]
            yield pack(key, tag, segments[segment], offset, length, number, tokens_in, tokens_out)


def decode_index(data: bytes) -> Iterator[tuple[bytes, Ref]]:
    table = Level0.parse(data)
    if table is None:
        return
    for row in range(table.rows):
        yield table.body[row * table.entry.size : row * table.entry.size + KEY_PART], table.ref(row)


def segment_rows(data: bytes, segment: str, request_format: RequestFormat) -> Iterator[tuple[bytes, Ref]]:
    """(key, ref) of each whole row of a local segment; a row a kill cut short has no newline and
    is skipped. Only a segment a killed run left without an index is read this way, its answers'
    bodies as `request_format` reads them."""
    at = 0
    while True:
        end = data.find(b"\n", at)
        if end < 0:
            return
        if end - at > ANSWER_AT and data[at + ANSWER_AT - 1] == 9:
            with contextlib.suppress(ValueError):
                key = bytes.fromhex(data[at : at + KEY_BYTES * 2].decode())
                tag = bytes.fromhex(data[at + KEY_BYTES * 2 + 1 : at + ANSWER_AT - 1].decode())
                body = orjson.loads(data[at + ANSWER_AT : end]).get("body")
                model, tokens_in, tokens_out = answer_usage(body, request_format)
                yield key, Ref(segment, at, end + 1 - at, tag, model, tokens_in, tokens_out)
        at = end + 1


def index_of_segment(segment: str) -> str:
    """The level-0 index a local segment gets once it is read (its run was killed before closing it)."""
    return INDEXES + segment.removeprefix(SEGMENTS).removesuffix(SEGMENT_SUFFIX) + INDEX_SUFFIX


def is_level0(name: str) -> bool:
    return name.startswith(INDEXES) and name.endswith(INDEX_SUFFIX) and "/" not in name[len(INDEXES) :]


# --- level 1 ------------------------------------------------------------------------------------

# rows a partition holds at most, about 1.1 MB: the cache's size picks how many partitions
PARTITION_ROWS = 25_000
# 16**6 partitions of 25,000 rows: 400 billion answers
MAX_DIGITS = 6


def partitions(digits: int) -> int:
    return 1 << (4 * digits)


def digits_for(rows: int) -> int:
    """How many leading hex digits of the key name a partition: 0 (one object) while small."""
    digits = 0
    while rows > PARTITION_ROWS * partitions(digits) and digits < MAX_DIGITS:
        digits += 1
    return digits


def partition_of(key: bytes, digits: int) -> int:
    return int.from_bytes(key[:4], "big") >> (32 - 4 * digits) if digits else 0


def partition_start(partition: int, digits: int) -> bytes:
    """The lowest key prefix a partition holds (4 bytes)."""
    return (partition << (32 - 4 * digits)).to_bytes(4, "big") if digits else bytes(4)


def generation_folder(generation: str) -> str:
    return f"{INDEXES}gen-{generation}/"


def manifest_name(generation: str) -> str:
    return f"{INDEXES}gen-{generation}{GENERATION_SUFFIX}"


def generation_of(name: str) -> str | None:
    """The generation a manifest or a generation's folder names."""
    rest = name.removeprefix(INDEXES)
    if not rest.startswith("gen-"):
        return None
    rest = rest.removeprefix("gen-")
    if rest.endswith(GENERATION_SUFFIX):
        return rest.removesuffix(GENERATION_SUFFIX)
    return rest.removesuffix("/") if rest.endswith("/") and "/" not in rest[:-1] else None


def partition_name(generation: str, partition: int, digits: int) -> str:
    return (
        f"{generation_folder(generation)}p{partition:0{digits}x}.rows"
        if digits
        else f"{generation_folder(generation)}p.rows"
    )


def segments_name(generation: str) -> str:
    return generation_folder(generation) + "segments.bin"


def plan_name(generation: str) -> str:
    return generation_folder(generation) + "plan.json"


@dataclass
class SegmentTable:
    """A generation's segments and models, numbered for its rows. A slot whose segment is gone
    keeps its number with no name (and time 0); new segments take new numbers."""

    names: list[str] = field(default_factory=list)
    times: list[int] = field(default_factory=list)
    # rows each segment has in the generation (0 once it is gone): what sizes the next one
    rows: list[int] = field(default_factory=list)
    models: list[str] = field(default_factory=list)

    def add(self, name: str, time: int, rows: int) -> int:
        self.names.append(name)
        self.times.append(time)
        self.rows.append(rows)
        return len(self.names) - 1

    def drop(self, slot: int) -> None:
        self.names[slot], self.times[slot], self.rows[slot] = "", 0, 0

    def encode(self) -> bytes:
        count = len(self.names)
        numbers = struct.pack(f"<{count}I{count}I", *self.times, *self.rows)
        return SEGMENT_TABLE_MAGIC + encode_names(self.names) + numbers + encode_names(self.models)

    @classmethod
    def decode(cls, data: bytes) -> SegmentTable:
        if not data.startswith(SEGMENT_TABLE_MAGIC):
            raise ValueError("not a segment table")
        names, at = _names(data, len(SEGMENT_TABLE_MAGIC))
        count = len(names)
        times = list(struct.unpack_from(f"<{count}I", data, at))
        rows = list(struct.unpack_from(f"<{count}I", data, at + 4 * count))
        models, _ = _names(data, at + 8 * count)
        return cls(names, times, rows, models)

    def live(self, cutoff: float) -> bytearray:
        """1 for each slot whose segment is still there and not expired by `cutoff`."""
        return bytearray(1 if name and time >= cutoff else 0 for name, time in zip(self.names, self.times, strict=True))


@dataclass(frozen=True)
class Manifest:
    """A published generation: written last, so its partitions and segment table are all there."""

    generation: str
    digits: int
    rows: list[int]
    # the level-0 indexes its rows hold: readers of this generation skip them
    consumed: list[str]
    published: float
    base: str | None = None

    @property
    def answers(self) -> int:
        return sum(self.rows)

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "generation": self.generation,
                "base": self.base,
                "digits": self.digits,
                "rows": self.rows,
                "consumed": self.consumed,
                "published": self.published,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        doc = orjson.loads(data)
        return cls(doc["generation"], doc["digits"], doc["rows"], doc["consumed"], doc["published"], doc["base"])


def first_rows(rows: bytes) -> dict[bytes, int]:
    """Key (16 bytes) to the first row that has it, in packed sorted rows."""
    size = ROW.size
    starts = range(len(rows) - size, -1, -size)
    # reversed, so that of rows sharing a key the first is kept
    return dict(zip([rows[at : at + KEY_PART] for at in starts], [at // size for at in starts], strict=True))
