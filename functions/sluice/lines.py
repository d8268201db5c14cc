"""Reading and validating input lines (the OpenAI Batch input format)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import orjson

from .model import SUPPORTED_URLS, ErrorCode, Request

MAX_LINE_BYTES = 1_000_000
BOM = b"\xef\xbb\xbf"


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
) -> Request | LineError | None:
    """Validate one input line; None for a blank line, which is not a request.

    `model`, when given, replaces the body's model (a per-job override), in the one encode
    the body needs anyway.
    """
    if line == 1 and raw.startswith(BOM):
        raw = raw[len(BOM) :]
    raw = raw.rstrip(b"\r\n")
    if not raw.strip():
        return None
    if len(raw) > max_bytes:
        return LineError(line, ErrorCode.LINE_TOO_LARGE, f"line {line}: {len(raw)} bytes, the limit is {max_bytes}")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return LineError(line, ErrorCode.INVALID_ENCODING, f"line {line}: not UTF-8 (byte {exc.start + 1})")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return LineError(line, ErrorCode.INVALID_JSON, f"line {line}: invalid JSON: {exc}")
    if not isinstance(doc, dict):
        return LineError(line, ErrorCode.INVALID_LINE, f"line {line}: expected a JSON object, got {type(doc).__name__}")
    custom_id = doc.get("custom_id")
    if custom_id is None or custom_id == "":
        return LineError(line, ErrorCode.MISSING_CUSTOM_ID, f"line {line}: missing custom_id")
    if not isinstance(custom_id, str):
        return LineError(line, ErrorCode.MISSING_CUSTOM_ID, f"line {line}: custom_id must be a string")
    method = doc.get("method")
    if method != "POST":
        return LineError(line, ErrorCode.INVALID_METHOD, f"line {line}: method must be POST, got {method!r}", custom_id)
    url = doc.get("url")
    if url not in SUPPORTED_URLS:
        supported = ", ".join(sorted(SUPPORTED_URLS))
        return LineError(
            line, ErrorCode.UNSUPPORTED_URL, f"line {line}: unsupported url {url!r}; use one of {supported}", custom_id
        )
    body = doc.get("body")
    if not isinstance(body, dict):
        return LineError(line, ErrorCode.INVALID_BODY, f"line {line}: body must be a JSON object", custom_id)
    if model is not None:
        body["model"] = model
    return Request(
        line=line, custom_id=custom_id, method="POST", path=url, body=orjson.dumps(body) if keep_body else None
    )


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
