import orjson
import pytest
from sluice.lines import LineError, parse_line, split_lines
from sluice.model import ErrorCode, Request

GOOD = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}


def line(doc: object) -> bytes:
    return orjson.dumps(doc) + b"\n"


@pytest.mark.parametrize(
    ("raw", "code", "fragment"),
    [
        (b"{not json\n", ErrorCode.INVALID_JSON, "invalid JSON"),
        (b"[1, 2]\n", ErrorCode.INVALID_LINE, "expected a JSON object"),
        (line({**GOOD, "custom_id": None}), ErrorCode.MISSING_CUSTOM_ID, "missing custom_id"),
        (line({k: v for k, v in GOOD.items() if k != "custom_id"}), ErrorCode.MISSING_CUSTOM_ID, "missing custom_id"),
        (line({**GOOD, "custom_id": 7}), ErrorCode.MISSING_CUSTOM_ID, "must be a string"),
        (line({**GOOD, "method": "GET"}), ErrorCode.INVALID_METHOD, "method must be POST"),
        (line({**GOOD, "url": "/v1/images"}), ErrorCode.UNSUPPORTED_URL, "unsupported url"),
        (line({**GOOD, "body": "text"}), ErrorCode.INVALID_BODY, "body must be a JSON object"),
        (b'{"custom_id": "\xff"}\n', ErrorCode.INVALID_ENCODING, "not UTF-8"),
    ],
)
def test_bad_lines_name_the_line_and_the_problem(raw: bytes, code: str, fragment: str) -> None:
    result = parse_line(raw, 17)
    assert isinstance(result, LineError)
    assert result.code == code
    assert result.message.startswith("line 17: ")
    assert fragment in result.message


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
