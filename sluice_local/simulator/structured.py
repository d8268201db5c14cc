"""Structured output and its faults: the JSON a request asks for, a conforming answer, and the
answers a pipeline cannot use (issue 33).

A request that asks for JSON (chat's `response_format`, the Responses API's `text.format`,
Anthropic's `output_format`) is answered with JSON; one with a JSON schema, with an object made
to match it. At set rates (`SimConfig.rate_off_schema`, `rate_invalid_json`, `rate_truncated`,
`rate_refusal`) the answer is instead off the schema, not JSON at all, cut short at its output
limit, or a refusal, drawn from (seed, key, attempt) like every other fault, so a request sent
again may be answered well.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from sluice_local.simulator.config import SimConfig

OFF_SCHEMA = "off_schema"
INVALID_JSON = "invalid_json"
TRUNCATED = "truncated"
REFUSAL = "refusal"
REFUSAL_TEXT = "I'm sorry, but I can't help with that request."
_JSON_TYPES = frozenset({"json_object", "json_schema"})
# whether a request asks for JSON, and the schema it gives (None: none)
Asked = tuple[bool, dict[str, Any] | None]
# how deep a made-up object nests before it stops adding what is optional
_MAX_DEPTH = 8


@dataclass(slots=True)
class Reply:
    """What a text answer says: built by a plan when the answer is given, so a fault drawn after
    planning still shapes it."""

    text: str | None
    truncated: bool = False
    refusal: str | None = None


def asked_format(path: str, data: Mapping[str, Any]) -> Asked:
    """Whether a request body sent to `path` asks for JSON, and the schema it gives (None: none)."""
    fmt: Any = None
    if path == "/v1/chat/completions":
        fmt = data.get("response_format")
        spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
    else:
        if path == "/v1/responses":
            text = data.get("text")
            fmt = text.get("format") if isinstance(text, dict) else None
        else:
            fmt = data.get("output_format")
        schema = fmt.get("schema") if isinstance(fmt, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") not in _JSON_TYPES:
        return False, None
    return True, schema if fmt.get("type") == "json_schema" and isinstance(schema, dict) else None


def conforming(schema: Mapping[str, Any], seed: str, depth: int = 0) -> Any:
    """A value that matches a simple JSON schema (types, properties, required, enum, const, items,
    minimum/maximum, min/maxLength, min/maxItems, anyOf/oneOf/allOf's first), made from `seed`."""
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[_number(seed) % len(enum)]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and isinstance(options[0], dict):
            return conforming({**{k: v for k, v in schema.items() if k != key}, **options[0]}, seed, depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties")
        props: Mapping[str, Any] = properties if isinstance(properties, dict) else {}
        required = set(schema.get("required") or ())
        return {
            name: conforming(sub if isinstance(sub, dict) else {}, f"{seed}.{name}", depth + 1)
            for name, sub in props.items()
            if name in required or depth < _MAX_DEPTH
        }
    if kind == "array":
        items = schema.get("items")
        low = schema.get("minItems", 1)
        high = schema.get("maxItems", max(low, 2))
        count = min(max(low, 1 + _number(seed) % 2), high)
        sub = items if isinstance(items, dict) else {}
        return [conforming(sub, f"{seed}[{i}]", depth + 1) for i in range(count)]
    if kind in ("integer", "number"):
        low = schema["minimum"] if "minimum" in schema else schema.get("exclusiveMinimum", -1) + 1
        high = schema["maximum"] if "maximum" in schema else schema.get("exclusiveMaximum", low + 101) - 1
        value = low + _number(seed) % (int(high - low) + 1) if high >= low else low
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return _number(seed) % 2 == 0
    if kind == "null":
        return None
    text = f"simulated {seed.rsplit('.', 1)[-1]}"
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    text = text.ljust(low, "x")
    return text[:high] if isinstance(high, int) else text


def violating(schema: Mapping[str, Any] | None, value: Any) -> Any:
    """`value` put off `schema`: a required property dropped, else its first property given the
    wrong type, else a value of another type altogether."""
    if isinstance(value, dict) and isinstance(schema, Mapping):
        required = [name for name in schema.get("required") or () if name in value]
        if required:
            return {k: v for k, v in value.items() if k != required[0]}
        if value:
            first = next(iter(value))
            return {**value, first: [] if isinstance(value[first], str) else "wrong type"}
    return ["not", "the", "asked", "shape"] if not isinstance(value, list) else {"not": "a list"}


def json_text(path: str, data: Mapping[str, Any], reply: str) -> str | None:
    """The JSON a request that asks for it is answered with (None: it asks for none)."""
    wants, schema = asked_format(path, data)
    if not wants:
        return None
    value = conforming(schema, _seed(data)) if schema is not None else {"answer": reply}
    return orjson.dumps(value).decode()


def pick_output_fault(config: SimConfig, seed: int, key: str, attempt: int) -> str | None:
    """The output fault of the `attempt`-th request with this key, or None: from its own draw, so
    adding output faults shifts none of the request faults."""
    digest = hashlib.blake2b(f"{seed}\x1foutput\x1f{key}\x1f{attempt}".encode(), digest_size=8).digest()
    u = struct.unpack("<Q", digest)[0] / 2**64
    edge = 0.0
    for rate, fault in (
        (config.rate_off_schema, OFF_SCHEMA),
        (config.rate_invalid_json, INVALID_JSON),
        (config.rate_truncated, TRUNCATED),
        (config.rate_refusal, REFUSAL),
    ):
        edge += rate
        if u < edge:
            return fault
    return None


def spoil(reply: Reply, fault: str | None, path: str, data: Mapping[str, Any], asked: Asked | None = None) -> None:
    """Make `reply` the answer `fault` calls for. Off the schema and invalid JSON only touch an
    answer that is JSON; a truncated one stops at half its text, as at its output limit. `asked`:
    what the request asks for, when its dialect says it elsewhere than `asked_format` looks."""
    if fault is None or reply.text is None:
        return
    if fault == REFUSAL:
        reply.text, reply.refusal, reply.truncated = None, REFUSAL_TEXT, False
    elif fault == TRUNCATED:
        reply.text, reply.truncated = reply.text[: max(1, len(reply.text) // 2)], True
    elif fault in (OFF_SCHEMA, INVALID_JSON):
        wants, schema = asked if asked is not None else asked_format(path, data)
        if not wants or reply.truncated:
            return
        if fault == INVALID_JSON:
            reply.text = reply.text[: max(1, len(reply.text) // 2)]
        else:
            reply.text = orjson.dumps(violating(schema, orjson.loads(reply.text))).decode()


def _seed(data: Mapping[str, Any]) -> str:
    return hashlib.blake2b(
        orjson.dumps(data.get("messages", data.get("input")), default=str), digest_size=6
    ).hexdigest()


def _number(seed: str) -> int:
    return int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=4).digest(), "little")
