"""`sluice cache stats|clear`: the local response cache that `sluice run` reads and fills."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson
from sluice.cache.entries import DirStore, clear, default_cache_dir, stats
from sluice.contract import DEFAULT_PROVIDER
from sluice.providers import family

from sluice_local.console import EXIT_USAGE, CliError, say


def _confirmed(where: Path, answers: int) -> bool:
    """Whether the user wants `answers` answers, each paid for once, deleted: asked on a terminal;
    off one (a script, a pipe) no one can answer, so --yes must say it."""
    if not sys.stdin.isatty():
        raise CliError(
            f"cache {where} holds {answers:,} answers, each paid for once: add --yes to delete them "
            "(asked only on a terminal)",
            EXIT_USAGE,
        )
    # the question on stderr, as every human-facing line: stdout stays the --json answer's
    print(f"cache {where}: delete {answers:,} answers, each paid for once? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def run(args: argparse.Namespace) -> int:
    where = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    store = DirStore(where)
    if args.action == "clear":
        # the local cache holds what `sluice run` filled, from a provider of the default family
        answers = stats(store, family(DEFAULT_PROVIDER))["answers"] if not args.yes else 0
        if answers and not _confirmed(where, answers):
            say(f"cache {where}: kept")
            return 0
        removed = clear(store)
        if args.json:
            print(orjson.dumps({"dir": str(where), "removed_files": removed}).decode())
        else:
            say(f"cache {where}: removed {removed:,} files")
        return 0
    figures = stats(store, family(DEFAULT_PROVIDER))
    if args.json:
        print(orjson.dumps({"dir": str(where), **figures}).decode())
        return 0
    print(
        f"cache {where}: {figures['answers']:,} answers to {figures['requests']:,} distinct requests, "
        f"in {figures['objects']:,} files, {figures['bytes']:,} bytes"
    )
    return 0
