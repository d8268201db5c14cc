import re

import orjson
import pytest
from sluice.contract.model import ErrorCode, Request
from sluice.formats.lines import LineError, parse_line, split_lines

GOOD = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}


def line(doc: object) -> bytes:
    return orjson.dumps(doc) + b"\n"


@pytest.mark.parametrize(
    ("raw", "code", "fragment"),
    [
        (b"{not json\n", ErrorCode.INVALID_JSON, "not JSON: a key not in double quotes"),
        (b"[1, 2]\n", ErrorCode.INVALID_LINE, "expected a JSON object"),
        (line({**GOOD, "custom_id": None}), ErrorCode.MISSING_CUSTOM_ID, "missing custom_id"),
        (line({k: v for k, v in GOOD.items() if k != "custom_id"}), ErrorCode.MISSING_CUSTOM_ID, "missing custom_id"),
        (line({**GOOD, "custom_id": 7}), ErrorCode.MISSING_CUSTOM_ID, "must be a string"),
        (line({**GOOD, "method": "GET"}), ErrorCode.INVALID_METHOD, "method must be POST"),
        (line({**GOOD, "url": "/v1/images"}), ErrorCode.UNSUPPORTED_URL, "unsupported url"),
        (line({**GOOD, "body": "text"}), ErrorCode.INVALID_BODY, "body must be a JSON object"),
        (line({k: v for k, v in GOOD.items() if k != "body"}), ErrorCode.INVALID_BODY, "body is missing"),
        (line({k: v for k, v in GOOD.items() if k != "method"}), ErrorCode.INVALID_METHOD, "method is missing"),
        (b'{"custom_id": "\xff"}\n', ErrorCode.INVALID_ENCODING, "not UTF-8"),
    ],
)
def test_bad_lines_name_the_line_and_the_problem(raw: bytes, code: str, fragment: str) -> None:
    result = parse_line(raw, 17)
    assert isinstance(result, LineError)
    assert result.code == code
    assert re.match(r"line 17(, column \d+)?: ", result.message), result.message
    assert fragment in result.message


def test_a_line_that_is_not_json_says_its_line_and_column_once() -> None:
    raw = line(GOOD).rstrip(b"}\n") + b", oops}\n"
    result = parse_line(raw, 2)
    assert isinstance(result, LineError)
    # not "line 2: invalid JSON: unexpected character: line 1 column 86 (char 85)"
    assert result.message == f"line 2, column {len(raw) - 5}: not JSON: a key not in double quotes"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # not "invalid JSON: invalid literal, expected 'true'" (its first letter is a t)
        (b"this is not json\n", "line 4, column 1: not JSON"),
        (b"custom_id,prompt\n", "line 4, column 1: not JSON"),
        (b'{"custom_id": "a", "method": POST}\n', "line 4, column 30: not JSON: a value that is not JSON (text needs"),
        (b'{"custom_id": "a", "method": post}\n', "line 4, column 30: not JSON: a value that is not JSON (text needs"),
        (b'{"custom_id": "a"\n', "line 4, column 18: not JSON: it ends before the JSON does (cut short?)"),
        (b'{"custom_id": "a"}}\n', "line 4, column 19: not JSON: more follows the JSON object"),
    ],
)
def test_a_line_that_is_not_json_says_so_in_plain_words(raw: bytes, message: str) -> None:
    result = parse_line(raw, 4)
    assert isinstance(result, LineError) and result.code == ErrorCode.INVALID_JSON
    assert result.message.startswith(message), result.message


def test_a_line_with_no_body_says_it_is_missing() -> None:
    """Not "body must be a JSON object": there is no body to be anything."""
    result = parse_line(line({k: v for k, v in GOOD.items() if k != "body"}), 9)
    assert isinstance(result, LineError)
    assert (result.message, result.custom_id) == ("line 9: body is missing", "a")


def test_a_line_over_the_limit_gives_its_size_readably() -> None:
    raw = line({**GOOD, "body": {"x": "y" * 20_000_000}})
    result = parse_line(raw, 5)
    assert isinstance(result, LineError)
    assert result.message == f"line 5: {len(raw) - 1:,} bytes; a line may hold at most 1,000,000"
    assert "20,000,0" in result.message


def test_good_line_keeps_provider_specific_fields() -> None:
    doc = {**GOOD, "body": {"model": "m", "max_queue_wait_s": 30}}
    result = parse_line(line(doc), 1)
    assert isinstance(result, Request)
    assert orjson.loads(result.body or b"") == {"model": "m", "max_queue_wait_s": 30}
    assert (result.custom_id, result.path, result.line) == ("a", "/v1/chat/completions", 1)


def test_bom_crlf_and_blank_lines() -> None:
    assert isinstance(parse_line(b"\xef\xbb\xbf" + line(GOOD), 1), Request)
    assert isinstance(parse_line(line(GOOD).rstrip(b"\n") + b"\r\n", 2), Request)
    assert parse_line(b"   \r\n", 3) is None


def test_line_over_the_limit() -> None:
    result = parse_line(line({**GOOD, "body": {"x": "y" * 100}}), 4, max_bytes=50)
    assert isinstance(result, LineError) and result.code == ErrorCode.LINE_TOO_LARGE


def test_split_lines_rejoins_lines_across_chunks() -> None:
    data = b"one\ntwo\nthree"
    for size in range(1, len(data) + 1):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        assert list(split_lines(chunks)) == [b"one\n", b"two\n", b"three"]


def huge(doc: dict[str, object], size: int = 1_100_000) -> bytes:
    """`doc` with a prompt that takes the line past the 1 MB limit, keys in the order given."""
    return orjson.dumps({**doc, "body": {"model": "m", "input": "y" * size}} if "body" in doc else doc) + b"\n"


@pytest.mark.parametrize(
    ("raw", "custom_id"),
    [
        # the usual order: custom_id first
        (huge({"custom_id": "big-1", "method": "POST", "url": "/v1/responses", "body": None}), "big-1"),
        # escapes in the id come back decoded, exactly as a parser would give them
        (huge({"custom_id": 'q"uo\\te é', "body": None}), 'q"uo\\te é'),
        # after a few short members
        (huge({"method": "POST", "url": "/v1/responses", "custom_id": "big-2", "body": None}), "big-2"),
        # the body first and custom_id last: found at the end of the line
        (huge({"method": "POST", "body": None}).rstrip(b"}\n") + b'}, "custom_id": "big-3"}\n', "big-3"),
    ],
)
def test_a_line_over_the_limit_keeps_its_custom_id(raw: bytes, custom_id: str) -> None:
    assert len(raw) > 1_000_000
    result = parse_line(raw, 9)
    assert isinstance(result, LineError) and result.code == ErrorCode.LINE_TOO_LARGE
    assert result.custom_id == custom_id
    assert result.message.startswith("line 9: ")


@pytest.mark.parametrize(
    "raw",
    [
        # the words inside a prompt, or as a nested key, are not the line's custom_id
        orjson.dumps({"body": {"input": 'say "custom_id": "fake"', "custom_id": "nested"}, "pad": "y" * 1_100_000})
        + b"\n",
        # a custom_id that is not a string is no id
        b'{"custom_id": 12, "body": {"input": "' + b"y" * 1_100_000 + b'"}}\n',
        # in the middle of a huge line, past what is searched: better none than a guess
        b'{"body": {"input": "' + b"y" * 600_000 + b'"}, "custom_id": "mid", "pad": "' + b"y" * 600_000 + b'"}\n',
        # not JSON at all
        b"custom_id " * 120_000 + b"\n",
    ],
)
def test_a_line_over_the_limit_without_a_findable_custom_id_has_none(raw: bytes) -> None:
    result = parse_line(raw, 3)
    assert isinstance(result, LineError) and result.code == ErrorCode.LINE_TOO_LARGE
    assert result.custom_id is None


def test_an_oversized_line_need_not_parse_to_give_its_custom_id() -> None:
    # cut short, with bytes that are neither UTF-8 nor JSON after the first kilobyte: only the
    # head is read, so the id is still found
    raw = b'{"custom_id": "cut", "body": {"input": "' + b"y" * 1000 + b"\xff\x00{[" * 300_000 + b"\n"
    result = parse_line(raw, 1)
    assert isinstance(result, LineError) and result.code == ErrorCode.LINE_TOO_LARGE
    assert result.custom_id == "cut"
