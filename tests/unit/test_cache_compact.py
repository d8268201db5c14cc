"""Compaction and expiry: level 0 folded into published generations, what expired dropped."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import sluice.cache.compact
import sluice.cache.index
from sluice.cache.blobs import INDEXES, SEGMENTS, CacheStore, DirStore
from sluice.cache.compact import GRACE_S, Compacted, GenerationPlan, compact
from sluice.cache.index import ROW, Manifest, generation_folder, is_level0, manifest_name
from sluice.cache.lookup import CacheView, IndexListing, read_manifest
from sluice.providers import OPENAI

from tests.unit.cache_fakes import DAY, NOW, WholeObjects, answer, ask, fill, request, text

FOREVER = float("inf")


def run(store: CacheStore, *, now: float = NOW, ttl_days: int = 0, deadline: float = FOREVER) -> Compacted:
    return compact(store, now=now, ttl_days=ttl_days, deadline=deadline)


def filled(store: CacheStore, segments: int, per: int = 3, *, first: int = 0) -> list[int]:
    """`segments` shard runs of `per` answers each, line numbers from `first + 1`; their lines."""
    lines: list[int] = []
    for s in range(segments):
        numbers = range(first + s * per + 1, first + (s + 1) * per + 1)
        fill(store, f"run-{first + s:04d}", [(request(n, {"q": n}), answer(n, f"a{n}")) for n in numbers])
        lines += numbers
    return lines


def asked(lines: list[int]) -> list:  # type: ignore[type-arg]
    return [request(n, {"q": n}) for n in lines]


def level0(store: CacheStore) -> list[str]:
    return [e.name for e in store.listing(INDEXES) if is_level0(e.name)]


def newest(store: CacheStore) -> Manifest:
    generation = IndexListing.read(store).newest
    assert generation is not None
    manifest = read_manifest(store, generation)
    assert manifest is not None
    return manifest


@pytest.fixture(autouse=True)
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    # a few answers make a generation and split it into partitions, as millions do deployed
    monkeypatch.setattr(sluice.cache.compact, "COMPACT_AT", 4)
    monkeypatch.setattr(sluice.cache.index, "PARTITION_ROWS", 8)


def test_level0_is_folded_into_a_generation_that_answers_the_same_and_is_read_in_its_place() -> None:
    store = WholeObjects()
    lines = filled(store, 3)
    assert run(store) == Compacted()  # three level-0 indexes: not yet worth a generation
    lines += filled(store, 2, first=9)
    before = ask(store, asked(lines))
    done = run(store)
    assert done.published and done.partitions == 16
    manifest = newest(store)
    assert manifest.digits == 1 and manifest.answers == len(lines) == 15
    assert sorted(manifest.consumed) == sorted(level0(store))
    assert ask(store, asked(lines)) == before
    # readers skip what the generation holds, which stays until no reader can be using it
    store.reads.clear()
    ask(store, asked(lines[:1]))
    assert not any(is_level0(name) for name, _ in store.reads)
    assert run(store, now=NOW + GRACE_S / 2).deleted == 0
    assert run(store, now=NOW + GRACE_S).deleted == 5 and level0(store) == []
    assert ask(store, asked(lines)) == before


def test_an_expired_answer_is_never_a_hit_in_either_level() -> None:
    store = WholeObjects()
    store.now = NOW - 6.5 * DAY
    old = filled(store, 4)
    store.now = NOW - 2 * DAY
    recent = filled(store, 1, first=20)
    # a 7-day TTL: S3 removes the old answers' segments within half a day; Plan stops a day early
    assert sorted(ask(store, asked(old + recent), now=NOW - 2 * DAY, ttl_days=7)) == old + recent
    assert sorted(ask(store, asked(old + recent), now=NOW, ttl_days=7)) == recent
    # the segments are still there (the lifecycle rule lags): without a TTL they would be hits
    assert len(ask(store, asked(old + recent), now=NOW)) == len(old + recent)

    # compacted before they expired, the same rows expire in level 1
    store.now = NOW - 2 * DAY
    assert run(store, now=NOW - 2 * DAY, ttl_days=7).published
    assert newest(store).answers == len(old + recent)
    assert sorted(ask(store, asked(old + recent), now=NOW - 2 * DAY, ttl_days=7)) == old + recent
    assert sorted(ask(store, asked(old + recent), now=NOW, ttl_days=7)) == recent


def test_the_index_shrinks_as_segments_expire_or_vanish() -> None:
    store = WholeObjects()
    store.now = NOW - 6.5 * DAY
    old = filled(store, 2)
    store.now = NOW - 3 * DAY
    kept = filled(store, 3, first=10)
    assert run(store, now=NOW - 3 * DAY, ttl_days=7).published
    first = newest(store)
    assert first.answers == 15
    # one kept segment vanishes (removed by hand, or by a lifecycle rule of its own)
    gone = [e.name for e in store.listing(SEGMENTS)][-1]
    store.delete([gone])
    # a day on, nothing new: the generation is swept all the same, the old answers dropped
    store.now = NOW
    assert run(store, now=NOW - 2.5 * DAY, ttl_days=7).generation is None
    done = run(store, now=NOW, ttl_days=7)
    assert done.published
    second = newest(store)
    assert second.generation != first.generation and second.answers == len(kept) - 3 == 6
    assert sorted(ask(store, asked(old + kept), now=NOW, ttl_days=7)) == kept[:6]
    # and the generation it replaced, with its partitions, goes once no reader can use it
    assert any(n.startswith(generation_folder(first.generation)) for n in store.names(INDEXES))
    run(store, now=NOW + GRACE_S, ttl_days=7)
    assert not any(n.startswith(generation_folder(first.generation)) for n in store.names(INDEXES))
    assert manifest_name(first.generation) not in store.names(INDEXES)


def test_compaction_resumes_where_it_stopped_and_readers_use_the_old_state_meanwhile() -> None:
    store = WholeObjects()
    lines = filled(store, 6)
    before = ask(store, asked(lines))
    ticks = itertools.count()
    # each call stops after a few partitions: the clock passes its deadline
    calls = []
    for _ in range(10):
        start = next(ticks)
        done = compact(store, now=NOW, ttl_days=0, deadline=start + 5, clock=lambda: next(ticks))
        calls.append(done)
        if done.published:
            break
        assert IndexListing.read(store).newest is None
        assert ask(store, asked(lines)) == before
    assert len(calls) > 1 and calls[-1].published
    assert len({c.generation for c in calls}) == 1
    assert sum(c.partitions for c in calls) == 16
    assert ask(store, asked(lines)) == before


def test_two_compactions_at_once_publish_one_generation_and_the_other_is_given_up() -> None:
    store = WholeObjects()
    lines = filled(store, 5)
    before = ask(store, asked(lines))
    listing = IndexListing.read(store)
    # two Merges plan a generation from the same state, each under its own name
    one = sluice.cache.compact._start(store, listing, None, now=NOW, ttl_days=0)
    two = sluice.cache.compact._start(store, listing, None, now=NOW, ttl_days=0)
    assert isinstance(one, GenerationPlan) and isinstance(two, GenerationPlan) and one.generation != two.generation
    # both build at once: the same partitions, written twice, are the same bytes
    for plan in (one, two):
        sluice.cache.compact._build(store, plan, None, deadline=FOREVER, clock=lambda: 0.0, now=NOW)
    published = IndexListing.read(store).manifests
    assert list(published) == [one.generation]
    assert ask(store, asked(lines)) == before
    # the other is given up, and its objects collected once no reader can use them
    assert run(store, now=NOW + GRACE_S).generation is None
    assert not any(n.startswith(generation_folder(two.generation)) for n in store.names(INDEXES))
    assert ask(store, asked(lines)) == before


def test_generations_split_and_fold_their_partitions_as_the_cache_grows_and_shrinks() -> None:
    store = WholeObjects()
    store.now = NOW - 5 * DAY
    lines = filled(store, 5, per=2)
    assert run(store, now=NOW - 5 * DAY, ttl_days=7).published
    assert newest(store).digits == 1
    store.now = NOW - DAY
    more = filled(store, 40, per=4, first=100)
    assert run(store, now=NOW - DAY, ttl_days=7).published
    assert newest(store).digits == 2 and newest(store).answers == 170
    assert len(ask(store, asked(lines + more), now=NOW - DAY, ttl_days=7)) == 170
    store.delete([e.name for e in store.listing(SEGMENTS)][5:])
    assert run(store, now=NOW, ttl_days=7).published
    # what is left fits fewer partitions
    assert newest(store).digits == 1 and newest(store).answers == 10
    assert sorted(ask(store, asked(lines + more), now=NOW, ttl_days=7)) == lines
    assert ask(store, asked(lines + more), now=NOW + 1.5 * DAY, ttl_days=7) == {}


def test_a_generation_keeps_the_newest_answer_a_line_got(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    fill(store, "first", [(request(1, {"q": 1}), answer(1, "old"))])
    fill(store, "second", [(request(1, {"q": 1}), answer(1, "new"))])
    filled(store, 3, first=10)
    assert run(store).published
    assert newest(store).answers == 10
    assert text(ask(store, asked([1]))[1]) == "new"
    # the rows are one a line: the local store's files stay as the generation left them
    view = CacheView.load(store, now=NOW, ttl_days=0, request_format=OPENAI)
    view.read_level0()
    assert view.level0_rows == 0 and len(view) == 10
    assert sum(e.size for e in store.listing(INDEXES, recursive=True) if e.name.endswith(".rows")) == 10 * ROW.size
