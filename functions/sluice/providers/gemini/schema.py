"""A chat line's JSON Schema (`response_format.json_schema.schema`) as Gemini's `responseSchema`
takes it: the OpenAPI 3.0 subset of `Schema` (upper-case `type`, `nullable` for a type that may
be null, `enum` of strings, `propertyOrdering` to keep the order the properties were written in),
`$ref`s into `$defs` inlined, and what only validation reads (`additionalProperties`, `$schema`,
`strict`) dropped. A keyword Gemini has no equivalent for (`not`, `if`, `patternProperties`, a
recursive `$ref`) is refused with its name: the line is an error at Plan, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..format import Unsupported

_TYPES = {"string", "number", "integer", "boolean", "array", "object", "null"}
# kept as they are: Gemini's Schema has each under the same name
_KEPT = frozenset(
    {
        "description",
        "format",
        "title",
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "pattern",
        "minProperties",
        "maxProperties",
        "required",
        "default",
        "example",
        "nullable",
    }
)
# validation's alone: the answer Gemini writes is checked against the line's schema anyway
_DROPPED = frozenset(
    {"$schema", "$id", "$defs", "definitions", "additionalProperties", "strict", "examples", "$comment"}
)
_REF_PREFIXES = ("#/$defs/", "#/definitions/")
_MAX_DEPTH = 32


def _refuse(where: str, why: str) -> Unsupported:
    return Unsupported(f"response_format.json_schema.schema{where}: {why}; Gemini's responseSchema has no equivalent")


def _resolve(ref: Any, defs: Mapping[str, Any], where: str, seen: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(ref, str) or not ref.startswith(_REF_PREFIXES):
        raise _refuse(where, f"a $ref outside $defs ({ref!r})")
    name = ref.split("/", 2)[2]
    if name in seen:
        raise _refuse(where, f"a recursive $ref ({ref})")
    found = defs.get(name)
    if not isinstance(found, dict):
        raise _refuse(where, f"a $ref to nothing ({ref})")
    return found


def _type(value: Any, where: str) -> tuple[str | None, bool]:
    """The one Gemini type of a JSON Schema `type`, and whether it may be null."""
    names = value if isinstance(value, list) else [value]
    if not all(isinstance(n, str) and n in _TYPES for n in names):
        raise _refuse(where, f"type {value!r}")
    nullable = "null" in names
    rest = [n for n in names if n != "null"]
    if len(rest) > 1:
        raise _refuse(where, f"a type of several kinds ({value!r})")
    return (rest[0].upper() if rest else None), nullable


def _convert(schema: Any, defs: Mapping[str, Any], where: str, seen: tuple[str, ...], depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise _refuse(where, f"nested deeper than {_MAX_DEPTH}")
    if not isinstance(schema, dict):
        raise _refuse(where, "not an object")
    if "$ref" in schema:
        ref = schema["$ref"]
        target = _resolve(ref, defs, where, seen)
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _convert(merged, defs, where, (*seen, str(ref).split("/", 2)[2]), depth + 1)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        at = f"{where}.{key}"
        if key in _DROPPED:
            continue
        if key == "type":
            kind, nullable = _type(value, at)
            if kind is not None:
                out["type"] = kind
            if nullable:
                out["nullable"] = True
        elif key in ("enum", "const"):
            values = value if key == "enum" else [value]
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise _refuse(at, "an enum of values other than strings")
            out["enum"] = values
            out.setdefault("type", "STRING")
            if "format" not in schema:
                out["format"] = "enum"
        elif key == "properties":
            if not isinstance(value, dict):
                raise _refuse(at, "not an object")
            out["properties"] = {
                name: _convert(sub, defs, f"{at}.{name}", seen, depth + 1) for name, sub in value.items()
            }
            # Gemini writes properties in alphabetical order unless told: the line's order is kept
            out["propertyOrdering"] = list(value)
        elif key == "items":
            out["items"] = _convert(value, defs, at, seen, depth + 1)
        elif key in ("anyOf", "oneOf"):
            if not isinstance(value, list) or not value:
                raise _refuse(at, "not a list of schemas")
            # one of several, for an answer to be written, is any of them
            out["anyOf"] = [_convert(sub, defs, f"{at}[{n}]", seen, depth + 1) for n, sub in enumerate(value)]
        elif key == "allOf" and isinstance(value, list) and len(value) == 1:
            out.update(_convert(value[0], defs, at, seen, depth + 1))
        elif key in _KEPT:
            out[key] = value
        else:
            raise _refuse(at, "a keyword it does not take")
    if out.get("type") is None and "anyOf" not in out and "enum" not in out:
        raise _refuse(where or " (its root)", "a schema naming no type")
    return out


def response_schema(schema: Any) -> dict[str, Any]:
    """The `responseSchema` of a line's JSON Schema; raises `Unsupported` naming what it cannot take."""
    if not isinstance(schema, dict):
        raise _refuse("", "not an object")
    defs = {**(schema.get("definitions") or {}), **(schema.get("$defs") or {})}
    return _convert(schema, defs, "", (), 0)


def json_schema(schema: Any) -> Any:
    """A `responseSchema` read back as the JSON Schema it says, for validation: lower-case types,
    `nullable` as a type that may be null, Gemini's ordering and enum format left out."""
    if isinstance(schema, list):
        return [json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("propertyOrdering", "nullable") or (key == "format" and value == "enum"):
            continue
        if key == "type" and isinstance(value, str):
            out["type"] = [value.lower(), "null"] if schema.get("nullable") else value.lower()
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    return out
