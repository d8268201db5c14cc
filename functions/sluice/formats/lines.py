"""Reading and validating input lines (the OpenAI Batch input format)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import orjson

from sluice.contract.model import ErrorCode, Request, ServiceTier
from sluice.providers import OPENAI, RequestFormat, Unsupported

MAX_LINE_BYTES = 1_000_000
BOM = b"\xef\xbb\xbf"
# how much of an oversized line is searched for its custom_id: it is usually the first key
HEAD_BYTES = 64 << 10
TAIL_BYTES = 4 << 10
# a JSON string, a bracket or a colon: enough to know each key's depth without parsing values;
# a lone quote is a string the search window cut, past which the scan would be out of step
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:]|"')
_CUSTOM_ID_KEY = b'"custom_id"'
# the object's last member, closing the line: `, "custom_id": "..."}`
_LAST_MEMBER = re.compile(rb',\s*"custom_id"\s*:\s*("(?:[^"\\]|\\.)*")\s*\}\s*$')


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    code: str
    message: str
    custom_id: str | None = None


def parse_line(
    raw: bytes,
    line: int,
    *,
    max_bytes: int = MAX_LINE_BYTES,
    keep_body: bool = True,
    model: str | None = None,
    default_model: str | None = None,
    sort_keys: bool = False,
    request_format: RequestFormat = OPENAI,
    service_tier: ServiceTier = "",
) -> Request | LineError | None:
    """Validate one input line; None for a blank line, which is not a request.

    `model`, when given, replaces the body's model (a per-job override), and `default_model`
    fills it in where the body names none (the environment's default), in the one encode the
    body needs anyway. `sort_keys` encodes it canonically (the response cache's key), for Plan,
    which sends nothing. The body kept is the one `request_format`'s provider is sent
    (`RequestFormat.to_wire`: a line in another family's shape translated); the path, the line's.
    `service_tier`: the tier the shard sends at, which the request carries beside its body where the
    family takes it and the line names none (`Request.tier`).
    """
    if line == 1 and raw.startswith(BOM):
        raw = raw[len(BOM) :]
    raw = raw.rstrip(b"\r\n")
    if not raw.strip():
        return None
    if len(raw) > max_bytes:
        return LineError(
            line,
            ErrorCode.LINE_TOO_LARGE,
            f"line {line}: {len(raw):,} bytes; a line may hold at most {max_bytes:,}",
            oversized_custom_id(raw),
        )
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return LineError(line, ErrorCode.INVALID_ENCODING, f"line {line}: not UTF-8 (byte {exc.start + 1})")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson's own text adds "line 1 column N (char M)": within this one line, the column is what says where
        return LineError(line, ErrorCode.INVALID_JSON, f"line {line}, column {exc.colno}: {_not_json(raw, exc)}")
    if not isinstance(doc, dict):
        return LineError(line, ErrorCode.INVALID_LINE, f"line {line}: expected a JSON object, got {type(doc).__name__}")
    custom_id = doc.get("custom_id")
    if custom_id is None or custom_id == "":
        return LineError(line, ErrorCode.MISSING_CUSTOM_ID, f"line {line}: missing custom_id")
    if not isinstance(custom_id, str):
        return LineError(line, ErrorCode.MISSING_CUSTOM_ID, f"line {line}: custom_id must be a string")
    method = doc.get("method")
    if method is None:
        return LineError(line, ErrorCode.INVALID_METHOD, f"line {line}: method is missing (must be POST)", custom_id)
    if method != "POST":
        return LineError(line, ErrorCode.INVALID_METHOD, f"line {line}: method must be POST, got {method!r}", custom_id)
    url = doc.get("url")
    if url not in request_format.paths:
        supported = ", ".join(sorted(request_format.paths))
        return LineError(
            line, ErrorCode.UNSUPPORTED_URL, f"line {line}: unsupported url {url!r}; use one of {supported}", custom_id
        )
    body = doc.get("body")
    if body is None:
        return LineError(line, ErrorCode.INVALID_BODY, f"line {line}: body is missing", custom_id)
    if not isinstance(body, dict):
        return LineError(line, ErrorCode.INVALID_BODY, f"line {line}: body must be a JSON object", custom_id)
    if model is not None:
        body["model"] = model
    elif default_model is not None and not body.get("model"):
        body["model"] = default_model
    try:
        body = request_format.to_wire(url, body)
    except Unsupported as exc:
        return LineError(line, ErrorCode.UNSUPPORTED_FIELD, f"line {line}: {exc}", custom_id)
    tier: ServiceTier = request_format.added_tier(url, body, service_tier) if service_tier else ""
    encoded = None
    if keep_body:
        encoded = orjson.dumps(body, option=orjson.OPT_SORT_KEYS) if sort_keys else orjson.dumps(body)
    return Request(
        line=line,
        custom_id=custom_id,
        method="POST",
        path=url,
        body=encoded,
        cache=doc.get("sluice_cache") is not False,
        tier=tier,
    )


# orjson's reasons in a user's words; one not here is said as orjson says it
_PLAIN_REASONS = {
    "unexpected end of data": "it ends before the JSON does (cut short?)",
    "unexpected content after document": "more follows the JSON object",
    "trailing comma is not allowed": "a comma before a closing bracket",
    "unexpected character, expected a string key": "a key not in double quotes",
    "unexpected character, expected a JSON value": "a value that is not JSON (text needs double quotes)",
}


def _not_json(raw: bytes, exc: orjson.JSONDecodeError) -> str:
    """Why a line is no JSON, in plain words: a line that does not even start as JSON (text, CSV,
    HTML) is just "not JSON", whatever word of it the parser tripped on."""
    if not raw.lstrip().startswith((b"{", b"[")):
        return "not JSON"
    if exc.msg.startswith("invalid literal"):
        return f"not JSON: {_PLAIN_REASONS['unexpected character, expected a JSON value']}"
    return f"not JSON: {_PLAIN_REASONS.get(exc.msg, exc.msg)}"


def _json_string(token: bytes) -> str | None:
    try:
        value = orjson.loads(token)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, str) and value else None


def oversized_custom_id(raw: bytes) -> str | None:
    """The custom_id of a line too large to parse, when it can be found without parsing it all.

    Looks in the first HEAD_BYTES for a `custom_id` key of the outermost object (a token scan
    that skips over strings, so the same words inside a prompt or a nested object never
    count), then at the end of the line for `custom_id` as the object's last member.
    None when neither holds it: a wrong id would be worse than none, since users join on it.
    """
    depth = 0
    is_key = False
    value_from = -1
    for match in _TOKEN.finditer(raw, 0, HEAD_BYTES):
        token = match.group()
        if token == b'"':
            break
        if value_from >= 0:
            # the value must follow the colon directly: a number or null in between is no id
            found = token.startswith(b'"') and not raw[value_from : match.start()].strip()
            return _json_string(token) if found else None
        if token == b":":
            value_from = match.end() if is_key else -1
            continue
        is_key = depth == 1 and token == _CUSTOM_ID_KEY
        if token in (b"{", b"["):
            depth += 1
        elif token in (b"}", b"]"):
            depth -= 1
    tail = _LAST_MEMBER.search(raw, max(0, len(raw) - TAIL_BYTES))
    return _json_string(tail.group(1)) if tail else None


# how much of a file or S3 body is read at a time while splitting it into lines
READ_CHUNK = 1 << 20


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Re-cut a stream of byte chunks into lines, each with its newline if it had one."""
    rest = b""
    for chunk in chunks:
        if not chunk:
            continue
        data = rest + chunk if rest else chunk
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            yield data[start : end + 1]
            start = end + 1
        rest = data[start:]
    if rest:
        yield rest
