"""Keyword options as the `sluice` command's arguments: each is its long option with `_` for `-`,
parsed by the command's own parser, so a Python caller gets the same defaults, checks and messages."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from sluice_local.api.errors import InputError, UsageError, raising_parser
from sluice_local.cli.parser import build_parser

# what a job is made of: a JSONL file's path, or the requests themselves (OpenAI Batch input lines)
Source = str | os.PathLike[str] | Iterable[Mapping[str, Any]]


def argv(command: str, positional: list[str], options: Mapping[str, Any]) -> list[str]:
    """`sluice COMMAND …` for `options`: True is a flag given, False and None one left out, a list
    a repeated option."""
    words = [command, *positional]
    for name, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif isinstance(value, list | tuple):
            for each in value:
                words += [flag, str(each)]
        else:
            words += [flag, str(value)]
    return words


def parse(command: str, positional: list[str], options: Mapping[str, Any]) -> argparse.Namespace:
    """The arguments `sluice COMMAND` would run with; a bad option raises `UsageError` with its message."""
    if any(not name.isidentifier() or name.startswith("_") for name in options):
        raise UsageError(f"options are keywords such as max_attempts=3, not {sorted(options)!r}")
    args = raising_parser(build_parser()).parse_args(argv(command, positional, options))
    args.started = time.monotonic()
    return args


@contextmanager
def input_file(source: Source, *, name: str) -> Iterator[Path]:
    """A path as it is; request dicts written, one a line as they come, to `<name>.jsonl` in a
    directory removed afterwards (the job and its outputs are named after it)."""
    if isinstance(source, str | os.PathLike):
        yield Path(source)
        return
    if isinstance(source, Mapping | bytes):
        raise UsageError("source is a path or an iterable of request dicts (OpenAI Batch input lines), not one dict")
    with tempfile.TemporaryDirectory(prefix="sluice-api-") as folder:
        path = Path(folder) / f"{name.removesuffix('.jsonl')}.jsonl"
        with path.open("wb") as out:
            for n, request in enumerate(source, start=1):
                try:
                    out.write(orjson.dumps(request) + b"\n")
                except TypeError as exc:
                    raise InputError(f"request {n} is not JSON: {exc}") from exc
        yield path
