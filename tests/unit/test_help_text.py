"""What a user reads in `--help` names no issue of the tracker: it means nothing outside it."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from local.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def test_no_sluice_command_help_names_an_issue() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    texts = {"sluice": parser.format_help()} | {name: p.format_help() for name, p in sub.choices.items()}
    assert {name: ISSUE.findall(text) for name, text in texts.items() if ISSUE.search(text)} == {}


@pytest.mark.parametrize(
    "script",
    sorted(
        str(path.relative_to(ROOT))
        for path in (*ROOT.glob("bench/**/*.py"), *ROOT.glob("examples/*.py"))
        if "description=__doc__" in path.read_text()
    ),
)
def test_a_script_whose_help_is_its_docstring_names_no_issue(script: str) -> None:
    docstring = ast.get_docstring(ast.parse((ROOT / script).read_text())) or ""
    assert ISSUE.findall(docstring) == []
