"""The response cache: a provider's successful answer, kept by what was asked, so it is paid once.

A line's key is the SHA-256 of the provider's base URL, the endpoint and the request body as
sent (after the job's model overrides), in canonical JSON (sorted keys): two lines that ask the
same thing of the same provider share an answer, whatever the job, the mode or the key order.
The value is the answer's `response` object exactly as a result line carries it (status code,
request id, body), kept inside that result line in S3: never a header, never an API key.

This module is what a line asks and what is kept of its answer, and the shards' half: filling.
A shard run writes one segment per 5,000 answers and one level-0 index beside it
(`sluice.cache.index`), in a `CacheStore` (`sluice.cache.blobs`): the job bucket's `cache/`, or a
directory for local runs. Plan's half, which answers lines from the cache, is `sluice.plan.cache_plan`
(lookups in `sluice.cache.lookup`); compaction, which folds level 0 into level 1 and drops what
expired, is `sluice.cache.compact`.

A segment in S3 (`segments/<name>.jsonl`) is the answers' result lines, the bytes the shard
writes to its own part anyway: filing an answer copies it once and packs its index row, which
keeps a cold run's cost close to a run without the cache. A local segment
(`segments/<name>.seg`: `<key hex>\t<line tag hex>\t<response>` rows) is appended to as each
answer arrives (one `os.write`), so a run killed with SIGKILL loses no answer; its index is
rebuilt from its rows, which carry their keys, by the next reader.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.cache.blobs import (
    INDEXES,
    SEGMENTS,
    Appender,
    CacheStore,
    DirStore,
    S3Store,
    cache_store,
    default_cache_dir,
)
from sluice.cache.compact import clear, stats
from sluice.cache.index import (
    INDEX_SUFFIX,
    RECORDS_SUFFIX,
    ROW,
    SEGMENT_SUFFIX,
    TAG_BYTES,
    Ref,
    answer_usage,
    decode_index,
    encode_index,
    index_bytes,
)
from sluice.contract import DEFAULT_PROVIDER
from sluice.contract.model import Outcome, Request
from sluice.providers import CUT_SHORT, UNFINISHED, RequestFormat

__all__ = [
    "INDEXES",
    "SEGMENTS",
    "CacheFill",
    "CacheStore",
    "DirStore",
    "FilledSegment",
    "Ref",
    "S3Store",
    "answer_of",
    "answer_usage",
    "cache_key",
    "cache_row",
    "cache_store",
    "cached_record",
    "clear",
    "decode_index",
    "default_cache_dir",
    "encode_index",
    "filed_usage",
    "line_tag",
    "stats",
]

# answers per segment a shard writes to S3: one per 5,000-line shard run, so a re-run of the
# job fetches its hits with about one ranged GET per shard
SEGMENT_ROWS = 5000


def canonical_body(body: bytes) -> bytes:
    return orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)


@functools.lru_cache(maxsize=64)
def _asked_of(base_url: str, path: str, provider: str) -> bytes:
    """Whom a line asks, which every line of a job shares. The family is named only when it is
    not OpenAI's: the keys caches filled before there were other families stay what they were,
    and a body another family is sent as it was written is never answered with OpenAI's answer."""
    asked = base_url.rstrip("/").encode() + b"\n" + path.encode() + b"\n"
    return asked if provider == DEFAULT_PROVIDER else provider.encode() + b"\n" + asked


def cache_key(
    base_url: str, path: str, body: bytes | None, *, canonical: bool = False, provider: str = DEFAULT_PROVIDER
) -> bytes:
    """What a line asks, and of whom: provider family (`provider`), base URL, endpoint, canonical body
    (`canonical`: it already is)."""
    asked = _asked_of(base_url, path, provider)
    if body:
        asked += body if canonical else canonical_body(body)
    # one call per line: a filling shard hashes every request it sends
    return hashlib.sha256(asked).digest()


def filed_usage(
    outcome: Outcome,
    request_format: RequestFormat,
    *,
    keep_incomplete: bool,
    usage: tuple[str, int, int] | None = None,
) -> tuple[str, int, int] | None:
    """What the index keeps of an answer the cache may keep, (model, tokens in, tokens out); None
    for any other. The cache keeps a provider's 200 answer, finished, or cut short (a response
    `incomplete`, a completion stopped by its token limit) when the job asks for those too, as
    `request_format` reads its body. `usage`: what the shard's figures already read of the body
    (`Stats.add_outcome`)."""
    body = outcome.body
    if not outcome.ok or outcome.status_code != 200 or not isinstance(body, dict):
        return None
    finish = request_format.finish(body)
    if finish == UNFINISHED or (finish == CUT_SHORT and not keep_incomplete):
        return None
    return usage or answer_usage(body, request_format)


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
        self.entries += ROW.pack(key, tag, 0, offset, length, number, tokens_in, tokens_out)
        self.count += 1

    def index(self, segment: str) -> bytes:
        """The index of this segment, as `encode_index` would write it from the same rows."""
        return index_bytes([segment], self.models, self.count, bytes(self.entries))


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
        request_format: RequestFormat,
        keep_incomplete: bool = False,
        keys_for: Any = None,
        canonical: bool = False,
    ) -> None:
        self._store = store
        # a local store's segment is appended to answer by answer
        self._dir = store if isinstance(store, DirStore) else None
        # the requests' bodies come with their keys sorted (`shard.read_shard_lines` for a filling job)
        self._canonical = canonical
        self._base_url = base_url
        self._name = name
        self._format = request_format
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
            cache_key(self._base_url, request.path, request.body, canonical=self._canonical, provider=self._format.name)
            if request.cache
            else None
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
        usage = filed_usage(outcome, self._format, keep_incomplete=self._keep_incomplete, usage=usage)
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
