"""Validation's CPU cost per line: the schema check with jsonschema and with
fastjsonschema, each compiled once per schema, on realistic answers, and a whole line through
`sluice.formats.validation.Validator` (read the answer, parse its JSON, check it against its schema).

The answers are chat.completions whose content is an extraction result (an object with strings,
numbers, an enum, a nested object and an array of objects), 10% of them off the schema, as the
simulator answers them. Prints µs a line for each, best of `--repeat`.

    .venv/bin/python bench/validation.py --lines 20000 --repeat 5
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastjsonschema
import jsonschema
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]

from sluice.formats.validation import Validator  # noqa: E402

CHAT = "/v1/chat/completions"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "sentiment": {"type": "string", "enum": ["positive", "neutral", "negative"]},
        "score": {"type": "number"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["city", "country"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
                "required": ["sku", "quantity"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["name", "age", "sentiment", "score", "address", "items"],
    "additionalProperties": False,
}
REQUEST = {"response_format": {"type": "json_schema", "json_schema": {"name": "extraction", "schema": SCHEMA}}}


def answer(rng: random.Random, off_schema: bool) -> dict[str, Any]:
    value: dict[str, Any] = {
        "name": f"customer {rng.randrange(10**6)}",
        "age": rng.randrange(18, 90),
        "sentiment": rng.choice(["positive", "neutral", "negative"]),
        "score": rng.random(),
        "address": {"city": "Lisbon", "country": "PT"},
        "items": [
            {"sku": f"SKU-{rng.randrange(1000)}", "quantity": rng.randrange(1, 9)} for _ in range(rng.randrange(1, 6))
        ],
    }
    if off_schema:
        value["age"] = str(value["age"])
    content = orjson.dumps(value).decode()
    message = {"role": "assistant", "content": content, "refusal": None}
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def best_us(run: Callable[[], None], lines: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best / lines * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(7)
    bodies = [answer(rng, rng.random() < 0.1) for _ in range(args.lines)]
    values = [orjson.loads(b["choices"][0]["message"]["content"]) for b in bodies]

    started = time.perf_counter()
    fast = fastjsonschema.compile(SCHEMA)
    fast_compile_ms = (time.perf_counter() - started) * 1e3
    started = time.perf_counter()
    cls = jsonschema.validators.validator_for(SCHEMA)
    cls.check_schema(SCHEMA)
    slow = cls(SCHEMA)
    slow_compile_ms = (time.perf_counter() - started) * 1e3

    def with_fast() -> None:
        for value in values:
            try:
                fast(value)
            except fastjsonschema.JsonSchemaValueException as e:
                _ = e.message

    def with_jsonschema() -> None:
        for value in values:
            error = jsonschema.exceptions.best_match(slow.iter_errors(value))
            if error is not None:
                _ = error.message

    validator = Validator(frozenset({"json", "schema", "cut_short", "refusal", "empty"}))

    def whole_line() -> None:
        for body in bodies:
            validator.validate(CHAT, REQUEST, body)

    print(f"{args.lines} answers, 10% off the schema; best of {args.repeat}")
    print(f"compile once   fastjsonschema {fast_compile_ms:8.2f} ms   jsonschema {slow_compile_ms:8.2f} ms")
    print(f"schema check   fastjsonschema {best_us(with_fast, args.lines, args.repeat):8.2f} µs/line")
    print(f"schema check   jsonschema     {best_us(with_jsonschema, args.lines, args.repeat):8.2f} µs/line")
    print(f"whole line     Validator      {best_us(whole_line, args.lines, args.repeat):8.2f} µs/line (all checks)")


if __name__ == "__main__":
    main()
