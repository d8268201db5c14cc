"""`sluice simulator`: the provider simulator alone, until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio

from sluice_local import simulator as sim
from sluice_local.console import EXIT_OK, EXIT_USAGE, CliError
from sluice_local.sim_options import config_from


def run(args: argparse.Namespace) -> int:
    if args.rate_429 + args.rate_500 + args.rate_drop + args.rate_slow > 1:
        raise CliError("--rate-429, --rate-500, --rate-drop and --rate-slow add up to more than 1", EXIT_USAGE)
    try:
        config = config_from(args)
    except ValueError as exc:
        raise CliError(f"simulator options: {exc}", EXIT_USAGE) from exc
    try:
        asyncio.run(sim.serve(args.host, args.port, config))
    except KeyboardInterrupt:
        return EXIT_OK
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", EXIT_USAGE) from exc
    return EXIT_OK
