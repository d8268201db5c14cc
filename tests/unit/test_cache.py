"""The response cache alone: keys, what is kept, the segment and index formats, the local store.

Compaction and expiry: tests/unit/test_cache_compact.py; lookups at scale: test_cache_lookup.py."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sluice.cache.entries import (
    INDEXES,
    SEGMENTS,
    CacheFill,
    DirStore,
    Ref,
    cache_key,
    clear,
    decode_index,
    encode_index,
    filed_usage,
    stats,
)
from sluice.contract import Settings
from sluice.contract.model import Outcome, Request
from sluice.core.records import result_record
from sluice.formats.lines import parse_line
from sluice.plan.plan import JobOptions, PlanError
from sluice.providers import OPENAI

from tests.unit.cache_fakes import BASE, PATH, WholeObjects, answer, ask, fill, request, text


def cacheable(outcome: Outcome, *, keep_incomplete: bool) -> bool:
    return filed_usage(outcome, OPENAI, keep_incomplete=keep_incomplete) is not None


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


def test_the_key_names_the_provider_family_and_an_openai_key_stays_as_it_was() -> None:
    body = b'{"b":1,"a":2}'
    openai = cache_key("https://a/v1/", "/v1/chat/completions", body, provider="openai")
    assert openai.hex() == "34cc3096adcc18546c787bc3ea6de47357d077a8e2b8621bbacf0242fe9eea26"
    anthropic = cache_key("https://a/v1/", "/v1/chat/completions", body, provider="anthropic")
    assert anthropic != openai
    assert anthropic == cache_key("https://a/v1", "/v1/chat/completions", b'{"a":2,"b":1}', provider="anthropic")


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
    filling = CacheFill(DirStore(Path("/nonexistent")), base_url=BASE, name="n", request_format=OPENAI, canonical=True)
    assert filling.key(in_plan) == CacheFill(
        DirStore(Path("/nonexistent")), base_url=BASE, name="n", request_format=OPENAI
    ).key(as_sent)


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
    from sluice.cache.entries import answer_usage
    from sluice.shard.stats import Stats

    stats = Stats()
    for body in ({"model": "m", "usage": {"input_tokens": 3, "output_tokens": 4}}, {"usage": {"prompt_tokens": 5}}):
        outcome = Outcome(1, "c", 200, body, "r")
        usage = stats.add_outcome(outcome, request_format=OPENAI)
        assert usage == answer_usage(body, OPENAI)
        assert filed_usage(outcome, OPENAI, keep_incomplete=False, usage=usage) == usage
    assert (
        stats.add_outcome(Outcome(2, "d", 500, {"error": "x"}, "r", error_code="server_error"), request_format=OPENAI)
        is None
    )


def local_fill(store: DirStore, name: str, pairs: list[tuple[Request, Outcome]]) -> CacheFill:
    """A local shard's filling, appended answer by answer; not closed (as after a SIGKILL)."""
    cache = CacheFill(store, base_url=BASE, name=name, request_format=OPENAI, canonical=True)
    for _ in cache.track(r for r, _ in pairs):
        pass
    for _, outcome in pairs:
        cache.add(outcome, result_record("job", outcome))
    return cache


def test_a_local_segment_has_every_answer_before_close_and_a_reader_indexes_it(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    pairs = [(request(n, {"q": n}), answer(n, f"a{n}")) for n in range(1, 6)]
    cache = local_fill(store, "killed", pairs)
    # never closed, as after a SIGKILL: no index yet, and the last row cut in half
    assert [e.name for e in store.listing(INDEXES)] == []
    (segment,) = [e.name for e in store.listing(SEGMENTS)]
    (tmp_path / segment).write_bytes((tmp_path / segment).read_bytes() + b"0" * 64 + b"\tdead")
    found = ask(store, [request(n, {"q": n}) for n in (2, 4)])
    assert [e.name for e in store.listing(INDEXES)] == ["index/killed.idx"]
    assert set(found) == {2, 4}
    assert orjson.loads(found[2][0]) == {"status_code": 200, "request_id": "req-2", "body": answer(2, "a2").body}
    assert len(ask(store, [request(n, {"q": n}) for n in range(1, 7)])) == 5
    cache.close()


def test_each_line_gets_its_own_answer_back_and_others_share_one(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    same = {"q": "same"}
    fill(store, "dups", [(request(1, same), answer(1, "first")), (request(2, same), answer(2, "second"))])
    found = ask(store, [request(1, same), request(2, same), request(3, same, "someone-else")])
    assert text(found[1]) == "first" and text(found[2]) == "second"
    assert text(found[3]) in ("first", "second")


def test_a_row_is_only_served_for_its_own_key(tmp_path: Path) -> None:
    store = DirStore(tmp_path)
    fill(store, "two", [(request(1, {"q": 1}), answer(1, "a")), (request(2, {"q": 2}), answer(2, "b"))])
    # an index whose first row points at the second answer (a segment rewritten under it)
    rows = list(decode_index(store.read("index/two.idx") or b""))
    (_, first), (_, second) = rows
    store.write("index/two.idx", encode_index([(rows[0][0], first._replace(offset=second.offset)), rows[1]]))
    found = ask(store, [request(1, {"q": 1}), request(2, {"q": 2})])
    assert sorted(found) == [2]


def test_the_answer_kept_is_the_result_lines_response_byte_for_byte() -> None:
    from sluice.cache.entries import answer_of

    tricky = answer(3, 'say ,"response": and ,"error":null}', custom_id='id ,"response":{"x":1},"error":null}')
    record = result_record("job", tricky)
    assert answer_of(record) == orjson.dumps({"status_code": 200, "request_id": "req-3", "body": tricky.body})
    assert orjson.loads(record)["response"] == orjson.loads(answer_of(record))


def test_index_round_trip_and_stats_and_clear(tmp_path: Path) -> None:
    entries = [
        (bytes([n]) * 32, Ref(f"segments/s{n % 2}.seg", n * 10, 10, bytes([n]) * 8, "gpt-4o-mini", n, 2 * n))
        for n in range(4)
    ]
    assert list(decode_index(encode_index(entries))) == [(k[:16], r) for k, r in entries]
    store = DirStore(tmp_path)
    fill(store, "s", [(request(n, {"q": n}), answer(n, str(n))) for n in range(3)])
    fill(store, "t", [(request(n, {"q": n}, "other"), answer(n, str(n), "other")) for n in range(1)])
    assert (stats(store, OPENAI)["answers"], stats(store, OPENAI)["requests"]) == (4, 3)
    assert clear(store) == 4
    assert stats(store, OPENAI)["answers"] == 0


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
    fill(store, "v2", [(request(1, {"q": 1}), priced), (request(2, {"q": 2}), answer(2, "b"))])
    found = ask(store, [request(1, {"q": 1}), request(2, {"q": 2})])
    assert found[1][1:] == ("gpt-4o-mini", 12, 3)
    assert found[2][1] == ""

    # an index the first release wrote: no usage in its rows, but every answer is still found
    ((key, ref), _) = list(decode_index(store.read("index/v2.idx") or b""))
    (segment,) = [e.name for e in store.listing(SEGMENTS)]
    names = struct.pack("<I", 1) + struct.pack("<H", len(segment)) + segment.encode()
    row = struct.pack("<16s8sIII", key, ref.tag, 0, ref.offset, ref.length)
    store.delete([e.name for e in store.listing(INDEXES)])
    store.write("index/v1.idx", b"SLUICE-CACHE-INDEX 1\n" + names + struct.pack("<I", 1) + row)
    ((line, (raw, model, tokens_in, _)),) = ask(store, [request(1, {"q": 1})]).items()
    # the usage is read from the answer itself
    assert line == 1 and (model, tokens_in) == ("gpt-4o-mini", 12)
    assert orjson.loads(raw)["body"]["usage"]["prompt_tokens"] == 12


def test_a_segment_written_whole_is_cut_at_its_size_and_is_the_answers_result_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sluice.cache.entries

    monkeypatch.setattr(sluice.cache.entries, "SEGMENT_ROWS", 3)
    store = WholeObjects()
    cache = CacheFill(store, base_url=BASE, name="shard", request_format=OPENAI, canonical=True)
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
    asked = [request(n, {"q": n}) for n in range(1, 6)]
    found = ask(store, asked)
    assert {n: raw for n, (raw, *_) in found.items()} == {
        n: orjson.dumps(orjson.loads(records[n])["response"]) for n in range(1, 6)
    }
    assert [(found[n][1], found[n][2]) for n in range(1, 6)] == [("m", n) for n in range(1, 6)]

    # a row that is not the result line its index says (a segment overwritten) serves nothing
    segment = store.names(SEGMENTS)[0]
    store.write(segment, store[segment].replace(b',"error":null}\n', b',"error":1234}\n', 1))
    assert sorted(ask(store, asked)) == [2, 3, 4, 5]


def test_segments_an_earlier_release_wrote_to_s3_keep_their_hits(tmp_path: Path) -> None:
    """Before segments were result lines, S3 had keyed rows (`.seg`), as local stores still do."""
    pairs = [(request(n, {"q": n}), answer(n, f"a{n}")) for n in range(1, 4)]
    local_fill(DirStore(tmp_path), "old", pairs).close()
    store = WholeObjects()
    for name in ("segments/old.seg", "index/old.idx"):
        store.write(name, (tmp_path / name).read_bytes())
    found = ask(store, [request(n, {"q": n}) for n in range(1, 4)])
    assert {n: text(f) for n, f in found.items()} == {1: "a1", 2: "a2", 3: "a3"}


@settings(max_examples=200, deadline=None)
@given(custom_id=st.text(min_size=1, max_size=40), spaced=st.booleans(), first=st.booleans())
@pytest.mark.slow
def test_plans_result_line_for_a_hit_is_the_one_the_cache_record_format_gives(
    custom_id: str, spaced: bool, first: bool
) -> None:
    """Plan takes a hit's custom_id from the line without parsing it where it can: the same bytes."""
    from sluice.cache.entries import cached_record
    from sluice.core.records import record_id
    from sluice.plan.cache_plan import cached_line, custom_id_json, record_ids

    doc = {"custom_id": custom_id, "method": "POST", "url": PATH, "body": {"q": '"custom_id"'}}
    if not first:
        doc = {"method": "POST", **doc}
    raw = json.dumps(doc, ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":")).encode()
    assert custom_id_json(raw) == orjson.dumps(custom_id)
    # a line that names its custom_id twice means the last one, as the shards' parser reads it
    twice = b'{"custom_id":"first",' + raw[1:]
    assert custom_id_json(twice) == orjson.dumps(custom_id)
    answer = b'{"status_code":200,"request_id":"r","body":{}}'
    for line in (1, 12345):
        expected = cached_record(record_id("job-1", line), custom_id, answer) + b"\n"
        assert cached_line(record_ids("job-1")(line), custom_id_json(raw), answer) == expected
