"""`sluice cache stats|clear`: the local response cache that `sluice run` reads and fills."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from sluice.cache.entries import DirStore, clear, default_cache_dir, stats
from sluice.contract import DEFAULT_PROVIDER
from sluice.providers import family

from local.console import say


def run(args: argparse.Namespace) -> int:
    where = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    store = DirStore(where)
    if args.action == "clear":
        removed = clear(store)
        if args.json:
            print(orjson.dumps({"dir": str(where), "removed_files": removed}).decode())
        else:
            say(f"cache {where}: removed {removed:,} files")
        return 0
    # the local cache holds what `sluice run` filled, from a provider of the default family
    figures = stats(store, family(DEFAULT_PROVIDER))
    if args.json:
        print(orjson.dumps({"dir": str(where), **figures}).decode())
        return 0
    print(
        f"cache {where}: {figures['answers']:,} answers to {figures['requests']:,} distinct requests, "
        f"in {figures['objects']:,} files, {figures['bytes']:,} bytes"
    )
    return 0
