"""What the response cache's unit tests share: a store written whole with a clock, filling it as
shards do, and asking it what Plan asks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from sluice.cache.blobs import Listed
from sluice.cache.entries import CacheFill, CacheStore, cache_key
from sluice.cache.lookup import CacheView
from sluice.contract.model import Outcome, Request
from sluice.core.records import result_record
from sluice.plan.cache_plan import JobKeys, fetch_answers, find_hits
from sluice.providers import OPENAI

BASE = "https://api.example.com/v1"
PATH = "/v1/chat/completions"
NOW = 1_900_000_000.0
DAY = 86_400.0


def request(line: int, body: Mapping[str, object], custom_id: str | None = None) -> Request:
    return Request(line, custom_id or f"c-{line}", "POST", PATH, orjson.dumps(body, option=orjson.OPT_SORT_KEYS))


def answer(line: int, text: str, custom_id: str | None = None, **body: object) -> Outcome:
    payload = {"id": f"chatcmpl-{line}", "choices": [{"finish_reason": "stop", "message": {"content": text}}], **body}
    return Outcome(line, custom_id or f"c-{line}", 200, payload, f"req-{line}")


@dataclass
class WholeObjects:
    """A store written whole, as the job bucket's `cache/` is (`S3Store`), whose objects are
    stamped with `now` when written; it counts reads and the bytes they return."""

    objects: dict[str, tuple[bytes, float]] = field(default_factory=dict)
    now: float = NOW
    reads: list[tuple[str, int]] = field(default_factory=list)

    def listing(self, folder: str, *, recursive: bool = False) -> list[Listed]:
        out: set[Listed] = set()
        for name, (data, written) in self.objects.items():
            if not name.startswith(folder):
                continue
            rest = name[len(folder) :]
            if "/" in rest and not recursive:
                out.add(Listed(folder + rest.split("/", 1)[0] + "/"))
            else:
                out.add(Listed(name, len(data), written))
        return sorted(out)

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
        found = self.objects.get(name)
        if found is None:
            return None
        data = found[0] if start is None else found[0][start:end]
        self.reads.append((name, len(data)))
        return data

    def write(self, name: str, data: bytes) -> None:
        self.objects[name] = (bytes(data), self.now)

    def delete(self, names: list[str]) -> None:
        for name in names:
            self.objects.pop(name, None)

    def __getitem__(self, name: str) -> bytes:
        return self.objects[name][0]

    def names(self, folder: str) -> list[str]:
        return sorted(n for n in self.objects if n.startswith(folder))


def fill(store: CacheStore, name: str, pairs: Iterable[tuple[Request, Outcome]], *, base_url: str = BASE) -> CacheFill:
    """What a shard run files: every answer, then its segment and index written (closed)."""
    pairs = list(pairs)
    cache = CacheFill(store, base_url=base_url, name=name, request_format=OPENAI, canonical=True)
    for _ in cache.track(r for r, _ in pairs):
        pass
    for _, outcome in pairs:
        cache.add(outcome, result_record("job", outcome))
    cache.write(cache.cut(last=True))
    cache.close()
    return cache


def ask(
    store: CacheStore, asked: Iterable[Request], *, now: float = NOW, ttl_days: int = 0
) -> dict[int, tuple[bytes, str | None, int, int]]:
    """What Plan gets from the cache for `asked`: (answer, model, tokens in, tokens out) by line."""
    view = CacheView.load(store, now=now, ttl_days=ttl_days, request_format=OPENAI)
    view.read_level0()
    asked = list(asked)
    keys = JobKeys(BASE, view.digits)
    for r in asked:
        keys.add(r)
    hits = find_hits(view, keys, max((r.line for r in asked), default=0))
    by_segment: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
    for r in asked:
        hit = hits.of(r.line)
        if hit is not None:
            by_segment.setdefault(hit[1], []).append((r.line, hit))
    lines = {r.line: r for r in asked}
    return fetch_answers(view, by_segment, lambda line: cache_key(BASE, PATH, lines[line].body, canonical=True))


def text(found: tuple[bytes, str | None, int, int]) -> str:
    return str(orjson.loads(found[0])["body"]["choices"][0]["message"]["content"])
