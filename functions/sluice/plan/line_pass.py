"""Plan's line pass: every line validated once and kept as a few bytes, then cut into shards.

Plan holds what it learns of a line in packed arrays, not objects: its length and its kind
(5 bytes), and until duplicates are settled a 12-byte hash of its custom_id (15 bytes, in 256
buckets). Two custom_ids share a 96-bit BLAKE2b hash by chance once in about 10**15 jobs of
10 million lines: the hash is taken as the id, as the response cache takes 128 bits of SHA-256
as the request. So a line costs Plan about 20 bytes whatever its custom_id, instead of the id.

Shards are cut in a second pass over those arrays, with the cache's hits known and fetched
(`sluice.plan.cache_plan`), so a shard grows past `shard_lines` only over answers Plan holds.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from sluice.contract.model import ErrorCode, Request
from sluice.formats.lines import LineError, parse_line
from sluice.providers import OPENAI, RequestFormat

MAX_SHARD_BYTES = 256 << 20
# the answers a shard the cache answers whole may grow to: Plan holds them (and their result
# lines) while it writes the shard's outputs
MAX_ANSWERED_BYTES = 64 << 20

BLANK, INVALID, REQUEST, KEYED, DUPLICATE = range(5)
_ID_HASH_BYTES = 12
_ID_ROW = struct.Struct(f"<{_ID_HASH_BYTES - 1}sI")


class KeySink(Protocol):
    """Takes each request whose answer the cache may hold (its body canonical), with its line."""

    def add(self, request: Request) -> None: ...


@dataclass
class LineTable:
    """What pass 1 keeps of each line, by line number (1-based: index `line - 1`)."""

    lengths: array[int] = field(default_factory=lambda: array("I"))
    kinds: bytearray = field(default_factory=bytearray)
    invalid: dict[str, int] = field(default_factory=dict)
    # for each duplicate line, the line whose custom_id it repeats (0: not a duplicate)
    first_of: array[int] | None = None
    requests: int = 0
    blank: int = 0

    @property
    def lines(self) -> int:
        return len(self.kinds)


@dataclass
class ShardRange:
    index: int
    start: int
    end: int
    first_line: int
    lines: int = 0
    requests: int = 0
    blank: int = 0
    duplicates: dict[int, int] = field(default_factory=dict)
    # lines the cache answered, and the bytes of their answers
    hits: int = 0
    answer_bytes: int = 0

    @property
    def answered(self) -> bool:
        """Every line a request or blank, and each request answered: nothing to send."""
        return self.hits == self.requests == self.lines - self.blank


def read_lines(
    lines: Iterable[bytes],
    *,
    model: str | None = None,
    default_model: str | None = None,
    keys: KeySink | None = None,
    models: set[str | None] | None = None,
    request_format: RequestFormat = OPENAI,
) -> LineTable:
    """Pass 1: validate each line, hash its custom_id, and hand each request to `keys`.

    With `models`, the model each valid request names (None: none) is added to it. Validation
    happens here, so that duplicates (which need the whole file) are known before any shard
    runs; shards re-validate their own lines with the same function. `request_format`: the job's
    provider family, which refuses what it cannot send.
    """
    table = LineTable()
    lengths, kinds = table.lengths, table.kinds
    ids = [bytearray() for _ in range(256)]
    keep_body = keys is not None or models is not None
    number = 0
    for raw in lines:
        number += 1
        lengths.append(len(raw))
        parsed = parse_line(
            raw,
            number,
            keep_body=keep_body,
            model=model,
            default_model=default_model,
            sort_keys=keys is not None,
            request_format=request_format,
        )
        if parsed is None:
            kinds.append(BLANK)
            table.blank += 1
            continue
        if isinstance(parsed, LineError):
            kinds.append(INVALID)
            table.invalid[parsed.code] = table.invalid.get(parsed.code, 0) + 1
            continue
        digest = hashlib.blake2b(parsed.custom_id.encode(), digest_size=_ID_HASH_BYTES).digest()
        ids[digest[0]] += _ID_ROW.pack(digest[1:], number)
        if models is not None:
            models.add(_model_of(parsed))
        if keys is not None and parsed.cache:
            keys.add(parsed)
            kinds.append(KEYED)
        else:
            kinds.append(REQUEST)
    _settle_duplicates(table, ids)
    return table


def _model_of(request: Request) -> str | None:
    model = orjson.loads(request.body or b"{}").get("model")
    return model if isinstance(model, str) and model else None


def _settle_duplicates(table: LineTable, buckets: list[bytearray]) -> None:
    """Mark each line whose custom_id an earlier line has: the first one wins."""
    kinds = table.kinds
    duplicates = 0
    for b, bucket in enumerate(buckets):
        first: dict[bytes, int] = {}
        for digest, line in _ID_ROW.iter_unpack(bucket):
            seen = first.setdefault(digest, line)
            if seen != line:
                if table.first_of is None:
                    table.first_of = array("I", bytes(4 * len(kinds)))
                table.first_of[line - 1] = seen
                kinds[line - 1] = DUPLICATE
                duplicates += 1
        buckets[b] = bytearray()
    table.requests = kinds.count(REQUEST) + kinds.count(KEYED)
    if duplicates:
        table.invalid[ErrorCode.DUPLICATE_CUSTOM_ID] = duplicates


def cut_shards(
    table: LineTable,
    *,
    shard_lines: int,
    shard_bytes: int = MAX_SHARD_BYTES,
    answer: Callable[[int], int | None] | None = None,
    closed: Callable[[ShardRange], None] | None = None,
) -> list[ShardRange]:
    """Cut shards at line starts; each holds at most `shard_lines` lines and `shard_bytes` bytes.

    `answer(line)` is the size of the answer the cache holds for a request line, fetched and
    checked (None: it holds none). A shard the cache answers whole never runs, so `shard_lines`
    does not bound it: it grows while its lines keep hitting, up to MAX_ANSWERED_BYTES, and
    Merge then copies its outputs server-side. `closed` sees each shard as it is cut, in order.
    """
    shards: list[ShardRange] = []
    lengths, kinds, first_of = table.lengths, table.kinds, table.first_of
    offset = 0
    current: ShardRange | None = None
    for index in range(len(kinds)):
        number = index + 1
        kind = kinds[index]
        length = lengths[index]
        size = answer(number) if answer is not None and kind == KEYED else None
        if current is None:
            current = ShardRange(index=0, start=0, end=0, first_line=1)
        elif current.lines > 0 and (
            offset - current.start + length > shard_bytes
            or (
                current.lines >= shard_lines
                and not (size is not None and current.answered and current.answer_bytes < MAX_ANSWERED_BYTES)
            )
        ):
            current.end = offset
            shards.append(current)
            if closed is not None:
                closed(current)
            current = ShardRange(index=len(shards), start=offset, end=offset, first_line=number)
        current.lines += 1
        offset += length
        if kind == BLANK:
            current.blank += 1
        elif kind == DUPLICATE:
            assert first_of is not None
            current.duplicates[number] = first_of[index]
        elif kind in (REQUEST, KEYED):
            current.requests += 1
            if size is not None:
                current.hits += 1
                current.answer_bytes += size
    if current is not None:
        current.end = offset
        shards.append(current)
        if closed is not None:
            closed(current)
    return shards
