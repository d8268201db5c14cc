"""Lookups in a big generation: Plan reads where the job's keys fall, not the whole cache."""

from __future__ import annotations

import os
import random

import pytest
from sluice.cache.entries import cache_key, line_tag
from sluice.cache.index import (
    ROW,
    Manifest,
    SegmentTable,
    decode_index,
    manifest_name,
    partition_name,
    partitions,
    segments_name,
)
from sluice.contract.model import Request

from tests.unit.cache_fakes import BASE, NOW, PATH, WholeObjects, answer, ask, fill, request, text


def generation(
    store: WholeObjects, digits: int, per_partition: int, extra: list[tuple[bytes, bytes, int, int, int]]
) -> None:
    """A published generation of random answers (`per_partition` rows in each partition), plus
    `extra` rows (key, tag, segment slot, offset, length): slot 0 a segment that is not there."""
    by_partition: dict[int, list[bytes]] = {p: [] for p in range(partitions(digits))}
    for p in range(partitions(digits)):
        for _ in range(per_partition):
            key = ((p << (32 - 4 * digits)) | random.getrandbits(32 - 4 * digits)).to_bytes(4, "big") + os.urandom(12)
            by_partition[p].append(ROW.pack(key, os.urandom(8), 0, 0, 100, 0, 0, 0))
    for key, tag, slot, offset, length in extra:
        partition = int.from_bytes(key[:4], "big") >> (32 - 4 * digits)
        by_partition[partition].append(ROW.pack(key, tag, slot, offset, length, 0, 1, 2))
    for p, packed in by_partition.items():
        store.write(partition_name("g1", p, digits), b"".join(sorted(packed)))
    segments = ["segments/never-read.jsonl", *sorted({n for n in store.names("segments/")})]
    table = SegmentTable(segments, [int(NOW)] * len(segments), [0] * len(segments), ["m"])
    store.write(segments_name("g1"), table.encode())
    rows = [len(by_partition[p]) for p in range(partitions(digits))]
    store.write(manifest_name("g1"), Manifest("g1", digits, rows, [], NOW).encode())


def job(lines: range) -> list[Request]:
    return [request(n, {"q": n}) for n in lines]


@pytest.mark.slow
def test_a_small_job_reads_the_few_rows_around_its_keys_not_the_cache() -> None:
    store = WholeObjects()
    # the job's answers were filed by an earlier run, then compacted into the big generation
    fill(store, "earlier", [(r, answer(r.line, f"a{r.line}")) for r in job(range(1, 6))])
    filed = {r.line: r for r in job(range(1, 6))}
    rows = list(decode_index(store["index/earlier-0001.idx"]))
    store.delete(["index/earlier-0001.idx"])
    extra = [(key, ref.tag, 1, ref.offset, ref.length) for key, ref in rows]
    generation(store, 2, 400, extra)
    total = sum(len(store[n]) for n in store.names("index/gen-g1/"))
    assert total > 100 * 1000

    store.reads.clear()
    found = ask(store, [*filed.values(), request(9, {"q": "not asked before"})])
    assert {n: text(f) for n, f in found.items()} == {n: f"a{n}" for n in range(1, 6)}
    partition_reads = [(name, size) for name, size in store.reads if name.endswith(".rows")]
    # a ranged read around each key, in the partitions the job's keys touch: a few KB each
    assert 1 <= len(partition_reads) <= 6
    assert sum(size for _, size in partition_reads) < total / 20
    # and one ranged read of the segment the answers are in
    assert [name for name, _ in store.reads if name.startswith("segments/")] == ["segments/earlier-0001.jsonl"]


def test_keys_far_from_where_uniform_keys_would_be_are_found_all_the_same() -> None:
    store = WholeObjects()
    fill(store, "earlier", [(r, answer(r.line, f"a{r.line}")) for r in job(range(1, 4))])
    rows = list(decode_index(store["index/earlier-0001.idx"]))
    store.delete(["index/earlier-0001.idx"])
    # a partition crowded with keys just above the job's: the estimate of their rank is far off
    crowd = [
        (key[:15] + bytes([min(255, key[15] + 1)]) if i % 2 else key[:8] + os.urandom(8), os.urandom(8), 0, 0, 1)
        for key, _ in rows
        for i in range(3000)
    ]
    extra = [(key, ref.tag, 1, ref.offset, ref.length) for key, ref in rows] + crowd
    generation(store, 0, 0, extra)
    found = ask(store, job(range(1, 4)))
    assert {n: text(f) for n, f in found.items()} == {1: "a1", 2: "a2", 3: "a3"}
    # the ranges read around the estimates did not hold them: the partition was read whole
    whole = len(store["index/gen-g1/p.rows"])
    assert ("index/gen-g1/p.rows", whole) in store.reads


def test_own_answers_are_found_across_levels_and_another_lines_answer_is_shared() -> None:
    store = WholeObjects()
    fill(store, "earlier", [(request(1, {"q": 1}), answer(1, "mine"))])
    rows = list(decode_index(store["index/earlier-0001.idx"]))
    store.delete(["index/earlier-0001.idx"])
    generation(store, 1, 50, [(key, ref.tag, 1, ref.offset, ref.length) for key, ref in rows])
    # level 0 has another line's answer to the same request: line 1 still gets its own
    fill(store, "later", [(request(2, {"q": 1}, custom_id="c-2"), answer(2, "theirs"))])
    found = ask(store, [request(1, {"q": 1}), request(3, {"q": 1}, custom_id="c-3")])
    assert text(found[1]) == "mine" and text(found[3]) in ("mine", "theirs")
    key = cache_key(BASE, PATH, b'{"q":1}', canonical=True)
    assert key[:16] == rows[0][0] and line_tag("c-1") == rows[0][1].tag


def test_a_big_level_zero_is_read_by_partition_over_a_small_generation() -> None:
    import sluice.cache.index

    store = WholeObjects()
    fill(store, "earlier", [(r, answer(r.line, f"a{r.line}")) for r in job(range(1, 4))])
    rows = list(decode_index(store["index/earlier-0001.idx"]))
    store.delete(["index/earlier-0001.idx"])
    generation(store, 0, 200, [(key, ref.tag, 1, ref.offset, ref.length) for key, ref in rows])
    # the answers of a big job since: level 0 outgrows the generation's one partition
    fill(store, "big", [(r, answer(r.line, f"b{r.line}")) for r in job(range(100, 400))])
    saved = sluice.cache.index.PARTITION_ROWS
    sluice.cache.index.PARTITION_ROWS = 16
    try:
        found = ask(store, job(range(1, 400)))
    finally:
        sluice.cache.index.PARTITION_ROWS = saved
    assert {n: text(f) for n, f in found.items()} == {
        **{n: f"a{n}" for n in range(1, 4)},
        **{n: f"b{n}" for n in range(100, 400)},
    }
    # the one partition of the generation is read around the keys of each of the job's
    assert sum(size for name, size in store.reads if name.endswith(".rows")) < 3 * len(store["index/gen-g1/p.rows"])
