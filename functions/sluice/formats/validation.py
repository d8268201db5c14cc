"""Per-line output validation (issue 33): whether an answer is one a pipeline can use.

The checks, each on or off for a job (`Settings.validate`): `json` (the answer parses as JSON where
the request asked for JSON, and every tool call's arguments do), `schema` (the JSON matches the
request's own JSON schema, or the schema the job names), `cut_short` (the answer stopped at its
output limit), `refusal` (a refusal, or a content filter stopped it) and `empty` (no text and no tool
call). A check that does not apply to a line (`schema` where no schema is given) passes it.

Schemas are compiled once each (fastjsonschema: `bench/validation.py` measures it against
jsonschema) and kept by their canonical JSON, so a job of a million lines with one schema compiles
it once per Lambda.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import fastjsonschema
import orjson

from sluice.providers import answers
from sluice.providers.reading import Answer

JSON: Final = "json"
SCHEMA: Final = "schema"
CUT_SHORT: Final = "cut_short"
REFUSAL: Final = "refusal"
EMPTY: Final = "empty"
# the order a line's checks run in: the first that fails names why, so a cut-short answer is
# reported cut short rather than as the invalid JSON it also is
CHECKS: Final = (REFUSAL, CUT_SHORT, EMPTY, JSON, SCHEMA)
# compiled schemas kept at once: a job has one or a few; lines each with their own schema would
# otherwise grow the cache without bound
MAX_SCHEMAS = 256


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why an answer failed: the check, and the validator's message (what a repair turn says)."""

    check: str
    message: str


Check = Any
_compiled: dict[bytes, Check] = {}


def compiled(schema: Mapping[str, Any]) -> Check:
    """The validator of `schema`, compiled the first time it is asked for."""
    key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    check = _compiled.get(key)
    if check is None:
        if len(_compiled) >= MAX_SCHEMAS:
            _compiled.pop(next(iter(_compiled)))
        check = _compiled[key] = fastjsonschema.compile(dict(schema))
    return check


def schema_problem(schema: Any) -> str | None:
    """Why `schema` is no JSON schema answers can be checked against; None when it is one."""
    if not isinstance(schema, dict):
        return "a schema is a JSON object"
    try:
        compiled(schema)
    except fastjsonschema.JsonSchemaDefinitionException as e:
        return str(e)
    return None


def schema_error(schema: Mapping[str, Any], value: Any) -> str | None:
    """What is wrong with `value` against `schema`; None when it matches."""
    try:
        compiled(schema)(value)
    except fastjsonschema.JsonSchemaValueException as e:
        return str(e.message)
    return None


def _parsed(text: str) -> tuple[Any, str | None]:
    try:
        return orjson.loads(text), None
    except orjson.JSONDecodeError as e:
        return None, str(e)


class Validator:
    """A job's checks (`checks`, each a name of `CHECKS`) and the schema it names (None: each line's
    own, where it has one)."""

    __slots__ = ("checks", "schema")

    def __init__(self, checks: frozenset[str], schema: Mapping[str, Any] | None = None) -> None:
        unknown = checks - frozenset(CHECKS)
        if unknown:
            raise ValueError(f"unknown validation checks {sorted(unknown)}; expected some of {', '.join(CHECKS)}")
        self.checks = checks
        self.schema = schema

    def __bool__(self) -> bool:
        return bool(self.checks)

    def validate(self, path: str, request: Mapping[str, Any], body: Any) -> Invalid | None:
        """Why the answer `body` to the request `request` (a line for `path`) fails the job's checks;
        None when it passes them all (or its path's answers are not read: embeddings)."""
        if not self.checks:
            return None
        answer = answers.read(path, body)
        if answer is None:
            return None if path not in answers.PATHS else Invalid(EMPTY, "the answer has no content to read")
        for check in CHECKS:
            if check in self.checks:
                found = self._check(check, path, request, answer)
                if found is not None:
                    return found
        return None

    def _check(self, check: str, path: str, request: Mapping[str, Any], answer: Answer) -> Invalid | None:
        if check == REFUSAL:
            return Invalid(REFUSAL, f"the answer is a refusal: {answer.refused}") if answer.refused else None
        if check == CUT_SHORT:
            return Invalid(CUT_SHORT, "the answer was cut short at its output limit") if answer.cut_short else None
        if check == EMPTY:
            empty = not (answer.text and answer.text.strip()) and not answer.arguments
            return Invalid(EMPTY, "the answer is empty") if empty else None
        asked = answers.asked(path, request)
        schema = self.schema if self.schema is not None else asked.schema
        wants_json = asked.json or self.schema is not None
        value, error = self._json(answer, wants_json)
        if check == JSON:
            return Invalid(JSON, error) if error is not None else None
        if schema is None or value is _NO_JSON:
            return None
        if error is not None:
            return Invalid(SCHEMA, f"{error}, so it cannot match the schema")
        problem = schema_error(schema, value)
        return Invalid(SCHEMA, f"the answer does not match the schema: {problem}") if problem is not None else None

    @staticmethod
    def _json(answer: Answer, wanted: bool) -> tuple[Any, str | None]:
        """The answer's JSON (`_NO_JSON` where none was asked for), or what makes it invalid: its
        tool calls' arguments always, its text where the request asked for JSON."""
        for arguments in answer.arguments:
            if isinstance(arguments, str):
                _, error = _parsed(arguments)
                if error is not None:
                    return None, f"a tool call's arguments are not valid JSON: {error}"
        if not wanted or answer.text is None:
            return _NO_JSON, None
        value, error = _parsed(answer.text)
        return (None, f"the answer is not valid JSON: {error}") if error is not None else (value, None)


_NO_JSON: Final = object()
