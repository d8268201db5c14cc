"""Every `sluice` command's arguments, help and examples: the commands of this machine
(`parser_local`), of a deployed environment (`parser_deployed`), and the options several share
(`parser_options`).

Only light modules are imported here: the parser is built for every command, `--help` included,
and a command's own module (with moto, boto3 or aiohttp behind it) is imported once it is chosen.
"""

from __future__ import annotations

import argparse
import textwrap
from importlib.metadata import PackageNotFoundError, version

from sluice_local.cli.parser_deployed import DEPLOYED_COMMANDS
from sluice_local.cli.parser_local import LOCAL_COMMANDS
from sluice_local.console import EXIT_CODES_HELP

# in the order `sluice --help` lists them
COMMANDS = (*LOCAL_COMMANDS, *DEPLOYED_COMMANDS)


def _version() -> str:
    try:
        return f"sluice {version('sluice')}"
    except PackageNotFoundError:
        return "sluice (not installed: run from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    """Every command's arguments; `args.command` names the module of sluice_local.cli that runs it."""
    parser = argparse.ArgumentParser(
        prog="sluice",
        allow_abbrev=False,
        description=textwrap.dedent(
            """\
            Push many LLM requests (OpenAI Batch JSONL) through an LLM provider (--provider).

            On this machine:        sluice run FILE · estimate FILE · verify · simulator
            On a deployed env:      sluice submit FILE --env dev · status · results · cancel · retry

            `sluice COMMAND --help` explains each, with an example.
            """
        ),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in COMMANDS:
        add_command(sub)
    return parser
