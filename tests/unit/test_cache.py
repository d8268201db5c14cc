"""The response cache alone: keys, what is kept, the segment and index formats, the local store."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import orjson
import pytest
from sluice.cache import (
    INDEXES,
    SEGMENTS,
    CacheFill,
    CacheIndex,
    DirStore,
    cache_key,
    clear,
    decode_index,
    encode_index,
    filed_usage,
    line_tag,
    stats,
)
from sluice.contract import Settings
from sluice.lines import parse_line
from sluice.model import Outcome, Request
from sluice.plan import JobOptions, PlanError
from sluice.records import result_record

BASE = "https://api.example.com/v1"


def cacheable(outcome: Outcome, *, keep_incomplete: bool) -> bool:
    return filed_usage(outcome, keep_incomplete=keep_incomplete) is not None


def request(line: int, body: Mapping[str, object], custom_id: str | None = None) -> Request:
    return Request(line, custom_id or f"c-{line}", "POST", "/v1/chat/completions", orjson.dumps(body))


def answer(line: int, text: str, custom_id: str | None = None, **body: object) -> Outcome:
    payload = {"id": f"chatcmpl-{line}", "choices": [{"finish_reason": "stop", "message": {"content": text}}], **body}
    return Outcome(line, custom_id or f"c-{line}", 200, payload, f"req-{line}")


def test_the_key_is_the_request_not_its_spelling() -> None:
    a = cache_key(BASE, "/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":"hi"}]}')
    b = cache_key(BASE + "/", "/v1/chat/completions", b'{"messages":[{"content":"hi","role":"user"}],"model":"m"}')
    assert a == b
    # the key is stable across releases, so a cache filled by an earlier one keeps its hits
    assert cache_key("https://a/v1/", "/v1/chat/completions", b'{"b":1,"a":2}').hex() == (
        "34cc3096adcc18546c787bc3ea6de47357d077a8e2b8621bbacf0242fe9eea26"
    )
    assert cache_key("https://other.example/v1", "/v1/chat/completions", b'{"model":"m"}') != cache_key(
        BASE, "/v1/chat/completions", b'{"model":"m"}'
    )
    assert cache_key(BASE, "/v1/completions", b'{"model":"m"}') != cache_key(
        BASE, "/v1/chat/completions", b'{"model":"m"}'
    )


def test_the_key_follows_the_jobs_model_override_as_plan_and_shards_see_it() -> None:
    raw = b'{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{"messages":[],"model":"a"}}'
    as_sent = parse_line(raw, 1, model="b")
    in_plan = parse_line(raw, 1, model="b", sort_keys=True)
    plain = parse_line(raw, 1)
    assert isinstance(as_sent, Request) and isinstance(in_plan, Request) and isinstance(plain, Request)
    # Plan encodes canonically once; a shard canonicalises what it sends: the same key
    assert cache_key(BASE, as_sent.path, as_sent.body) == cache_key(BASE, in_plan.path, in_plan.body, canonical=True)
    assert cache_key(BASE, plain.path, plain.body) != cache_key(BASE, as_sent.path, as_sent.body)
    # a filling shard reads its bodies sorted and hashes them as they are: still Plan's key
    filling = CacheFill(DirStore(Path("/nonexistent")), base_url=BASE, name="n", canonical=True)
    assert filling.key(in_plan) == CacheFill(DirStore(Path("/nonexistent")), base_url=BASE, name="n").key(as_sent)


def test_a_line_can_opt_out_beside_its_custom_id_without_changing_the_body() -> None:
    line = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}
    kept = parse_line(orjson.dumps(line), 1)
    opted = parse_line(orjson.dumps({**line, "sluice_cache": False}), 1)
    assert isinstance(kept, Request) and isinstance(opted, Request)
    assert kept.cache and not opted.cache
    assert opted.body == kept.body == b'{"model":"m"}'


def test_only_finished_successful_answers_are_kept() -> None:
    assert cacheable(answer(1, "ok"), keep_incomplete=False)
    failed = Outcome(1, "c", 500, {"error": "x"}, "r", error_code="retries_exhausted")
    assert not cacheable(failed, keep_incomplete=True)
    assert not cacheable(Outcome(1, "c", 201, {"id": "x"}, "r"), keep_incomplete=True)
    cut = answer(1, "par", choices=[{"finish_reason": "length"}])
    assert not cacheable(cut, keep_incomplete=False) and cacheable(cut, keep_incomplete=True)
    incomplete = Outcome(1, "c", 200, {"status": "incomplete", "output": [{}]}, "r")
    assert not cacheable(incomplete, keep_incomplete=False) and cacheable(incomplete, keep_incomplete=True)
    assert not cacheable(Outcome(1, "c", 200, {"status": "failed"}, "r"), keep_incomplete=True)


def test_the_usage_a_shards_figures_read_is_the_usage_the_index_keeps() -> None:
    from sluice.cache import answer_usage
    from sluice.stats import Stats

    stats = Stats()
    for body in ({"model": "m", "usage": {"input_tokens": 3, "output_tokens": 4}}, {"usage": {"prompt_tokens": 5}}):
        outcome = Outcome(1, "c", 200, body, "r")
        usage = stats.add_outcome(outcome)
        assert usage == answer_usage(body)
        assert filed_usage(outcome, keep_incomplete=False, usage=usage) == usage
    assert stats.add_outcome(Outcome(2, "d", 500, {"error": "x"}, "r", error_code="server_error")) is None


def fill(store: DirStore, name: str, outcomes: list[tuple[Request, Outcome]]) -> CacheFill:
    cache = CacheFill(store, base_url=BASE, name=name)
    for _ in cache.track(r for r, _ in outcomes):
        pass
    for _, outcome in outcomes:
        cache.add(outcome, result_record("job", outcome))
    return cache


def test_a_local_segment_has_every_answer_before_close_and_a_reader_indexes_it(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    pairs = [(request(n, {"q": n}), answer(n, f"a{n}")) for n in range(1, 6)]
    cache = fill(store, "killed", pairs)
    # never closed, as after a SIGKILL: no index yet, and the last row cut in half
    assert store.names(INDEXES) == []
    (segment,) = store.names(SEGMENTS)
    (tmp_path / segment).write_bytes((tmp_path / segment).read_bytes() + b"0" * 64 + b"\tdead")
    index = CacheIndex.load(store)
    assert len(index) == 5 and store.names(INDEXES) == ["index/killed.idx"]
    wanted = [(n, cache_key(BASE, "/v1/chat/completions", orjson.dumps({"q": n}))) for n in (2, 4)]
    found = dict(index.fetch((n, key, index.find(key, line_tag(f"c-{n}"))) for n, key in wanted))  # type: ignore[misc]
    assert set(found) == {2, 4}
    assert orjson.loads(found[2]) == {"status_code": 200, "request_id": "req-2", "body": answer(2, "a2").body}
    cache.close()


def test_each_line_gets_its_own_answer_back_and_others_share_one(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    same = {"q": "same"}
    fill(store, "dups", [(request(1, same), answer(1, "first")), (request(2, same), answer(2, "second"))]).close()
    index = CacheIndex.load(store)
    key = cache_key(BASE, "/v1/chat/completions", orjson.dumps(same))

    def text(custom_id: str) -> str:
        ref = index.find(key, line_tag(custom_id))
        assert ref is not None
        ((_, raw),) = list(index.fetch([(1, key, ref)]))
        return str(orjson.loads(raw)["body"]["choices"][0]["message"]["content"])

    assert text("c-1") == "first" and text("c-2") == "second"
    assert text("someone-else") in ("first", "second")


def test_a_row_is_only_served_for_its_own_key(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    fill(store, "one", [(request(1, {"q": 1}), answer(1, "a"))]).close()
    index = CacheIndex.load(store)
    key = cache_key(BASE, "/v1/chat/completions", orjson.dumps({"q": 1}))
    ref = index.find(key, line_tag("c-1"))
    assert ref is not None
    # a key that shares the first 16 bytes (what the index holds) is not served another's answer
    impostor = key[:16] + bytes(16)
    assert list(index.fetch([(1, impostor, ref)])) == []
    assert len(list(index.fetch([(1, key, ref)]))) == 1


def test_many_small_indexes_are_folded_into_one(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    for n in range(10):
        fill(store, f"part-{n}", [(request(n, {"q": n}), answer(n, str(n)))]).close()
    assert len(store.names(INDEXES)) == 10
    index = CacheIndex.load(store, compact_at=8)
    (only,) = store.names(INDEXES)
    assert only.startswith("index/compact-")
    again = CacheIndex.load(store, compact_at=8)
    assert len(again) == len(index) == 10 and sorted(again.entries()) == sorted(index.entries())


def test_the_answer_kept_is_the_result_lines_response_byte_for_byte() -> None:
    from sluice.cache import answer_of

    tricky = answer(3, 'say ,"response": and ,"error":null}', custom_id='id ,"response":{"x":1},"error":null}')
    record = result_record("job", tricky)
    assert answer_of(record) == orjson.dumps({"status_code": 200, "request_id": "req-3", "body": tricky.body})
    assert orjson.loads(record)["response"] == orjson.loads(answer_of(record))


def test_index_round_trip_and_stats_and_clear(tmp_path: Path) -> None:
    from sluice.cache import Ref

    entries = [
        (bytes([n]) * 32, Ref(f"segments/s{n % 2}.seg", n * 10, 10, bytes([n]) * 8, "gpt-4o-mini", n, 2 * n))
        for n in range(4)
    ]
    assert list(decode_index(encode_index(entries))) == [(k[:16], r) for k, r in entries]
    store = DirStore(tmp_path)
    fill(store, "s", [(request(n, {"q": n}), answer(n, str(n))) for n in range(3)]).close()
    assert stats(store)["answers"] == 3
    assert clear(store) == 2
    assert stats(store)["answers"] == 0


@pytest.mark.parametrize("value", ["sometimes", "ON", ""])
def test_a_bad_cache_option_is_refused_with_what_is_expected(value: str) -> None:
    settings = Settings(bucket="b", table="t", provider_base_url=BASE, api_key_secret_arn="arn")
    with pytest.raises(PlanError, match="expected one of on, read, write, off"):
        JobOptions.from_metadata({"sluice-cache": value}, settings)
    assert JobOptions.from_metadata({"sluice-cache": "read"}, settings).cache == "read"
    assert JobOptions.from_metadata({}, settings).cache == "on"
    with pytest.raises(PlanError, match="cache-incomplete"):
        JobOptions.from_metadata({"sluice-cache-incomplete": "maybe"}, settings)


def test_the_index_keeps_each_answers_usage_and_reads_the_first_releases_indexes(tmp_path: Path) -> None:
    import struct

    store = DirStore(tmp_path)
    priced = answer(1, "a", model="gpt-4o-mini", usage={"prompt_tokens": 12, "completion_tokens": 3})
    fill(store, "v2", [(request(1, {"q": 1}), priced), (request(2, {"q": 2}), answer(2, "b"))]).close()
    index = CacheIndex.load(store)
    key = cache_key(BASE, "/v1/chat/completions", orjson.dumps({"q": 1}))
    ref = index.find(key, line_tag("c-1"))
    assert ref is not None and (ref.model, ref.tokens_in, ref.tokens_out) == ("gpt-4o-mini", 12, 3)
    bare = index.find(cache_key(BASE, "/v1/chat/completions", orjson.dumps({"q": 2})), line_tag("c-2"))
    assert bare is not None and bare.model == ""

    # an index the first release wrote: no usage in its rows, but every answer is still found
    (segment,) = store.names(SEGMENTS)
    names = struct.pack("<I", 1) + struct.pack("<H", len(segment)) + segment.encode()
    row = struct.pack("<16s8sIII", key[:16], ref.tag, 0, ref.offset, ref.length)
    store.delete(store.names(INDEXES))
    store.write("index/v1.idx", b"SLUICE-CACHE-INDEX 1\n" + names + struct.pack("<I", 1) + row)
    old = CacheIndex.load(store)
    found = old.find(key, line_tag("c-1"))
    assert found is not None and found.model is None and (found.offset, found.length) == (ref.offset, ref.length)
    ((_, raw),) = list(old.fetch([(1, key, found)]))
    assert orjson.loads(raw)["body"]["usage"]["prompt_tokens"] == 12


class WholeObjects(dict[str, bytes]):
    """A store written whole, as the job bucket's `cache/` is (`S3Store`)."""

    def names(self, folder: str) -> list[str]:
        return sorted(n for n in self if n.startswith(folder))

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
        data = self.get(name)
        return data if data is None or start is None else data[start:end]

    def write(self, name: str, data: bytes) -> None:
        self[name] = data

    def delete(self, names: list[str]) -> None:
        for name in names:
            self.pop(name, None)

    def size(self) -> tuple[int, int]:
        return len(self), sum(map(len, self.values()))


def test_a_segment_written_whole_is_cut_at_its_size_and_is_the_answers_result_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sluice.cache

    monkeypatch.setattr(sluice.cache, "SEGMENT_ROWS", 3)
    store = WholeObjects()
    cache = CacheFill(store, base_url=BASE, name="shard")
    pairs = [(request(n, {"q": n}), answer(n, f"a{n}", model="m", usage={"input_tokens": n})) for n in range(1, 6)]
    for _ in cache.track(r for r, _ in pairs):
        pass
    records = {n: result_record("job", outcome) for n, (_, outcome) in enumerate(pairs, 1)}
    cuts = []
    for n, (_, outcome) in enumerate(pairs, 1):
        cache.add(outcome, records[n])
        cuts.append(cache.cut())
    # a segment every 3 answers while the run goes on, the rest when it ends, none when nothing is left
    assert [c is not None for c in cuts] == [False, False, True, False, False]
    last = cache.cut(last=True)
    assert last is not None and last.count == 2 and cache.cut(last=True) is None
    cache.write(cuts[2])
    cache.write(last)
    assert store.names(SEGMENTS) == ["segments/shard-0001.jsonl", "segments/shard-0002.jsonl"]
    # each segment is its answers' result lines, and its index points at each of them
    for segment, lines in zip(store.names(SEGMENTS), ([1, 2, 3], [4, 5]), strict=True):
        assert store[segment] == b"".join(records[n] + b"\n" for n in lines)
        index = store[INDEXES + segment.removeprefix(SEGMENTS).replace(".jsonl", ".idx")]
        assert [store[segment][ref.offset : ref.offset + ref.length] for _, ref in decode_index(index)] == [
            records[n] + b"\n" for n in lines
        ]
    loaded = CacheIndex.load(store)
    wanted = [(n, cache_key(BASE, "/v1/chat/completions", orjson.dumps({"q": n}))) for n in range(1, 6)]
    refs = [(n, key, loaded.find(key, line_tag(f"c-{n}"))) for n, key in wanted]
    found = dict(loaded.fetch(refs))  # type: ignore[arg-type]
    assert found == {n: orjson.dumps(orjson.loads(records[n])["response"]) for n in range(1, 6)}
    assert [(r.model, r.tokens_in) for _, _, r in refs] == [("m", n) for n in range(1, 6)]  # type: ignore[union-attr]

    # a row that is not the result line its index says (a segment overwritten) serves nothing
    segment = store.names(SEGMENTS)[0]
    store[segment] = store[segment].replace(b',"error":null}\n', b',"error":1234}\n', 1)
    assert sorted(dict(CacheIndex.load(store).fetch(refs))) == [2, 3, 4, 5]  # type: ignore[arg-type]


def test_segments_an_earlier_release_wrote_to_s3_keep_their_hits(tmp_path: Path) -> None:
    """Before segments were result lines, S3 had keyed rows (`.seg`), as local stores still do."""
    pairs = [(request(n, {"q": n}), answer(n, f"a{n}")) for n in range(1, 4)]
    fill(DirStore(tmp_path), "old", pairs).close()
    store = WholeObjects({name: (tmp_path / name).read_bytes() for name in ("segments/old.seg", "index/old.idx")})
    index = CacheIndex.load(store)
    keys = [(n, cache_key(BASE, "/v1/chat/completions", orjson.dumps({"q": n}))) for n in range(1, 4)]
    found = dict(index.fetch((n, key, index.find(key, line_tag(f"c-{n}"))) for n, key in keys))  # type: ignore[misc]
    assert {n: orjson.loads(raw)["body"]["choices"][0]["message"]["content"] for n, raw in found.items()} == {
        1: "a1",
        2: "a2",
        3: "a3",
    }
