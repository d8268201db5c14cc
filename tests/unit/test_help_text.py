"""What a user reads in `--help` names no issue of the tracker: it means nothing outside it."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from sluice_local.cli import build_parser

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


def test_the_readmes_generated_files_go_under_out_which_git_ignores() -> None:
    """big.jsonl was written at the repository's root, where `git status` showed it to be committed."""
    readme = (ROOT / "README.md").read_text()
    written = re.findall(r"make_reviews\.py [^\n#]*--out (\S+)", readme)
    assert written and all(path.startswith("out/") for path in written), written
    assert "out/" in (ROOT / ".gitignore").read_text().splitlines()
    for name in {Path(path).name for path in written}:
        # every command that reads it reads it where it was written
        assert {where.lstrip("`") for where in re.findall(rf"(\S*){re.escape(name)}", readme)} == {"out/"}


def test_make_reviews_writes_into_a_directory_a_fresh_clone_does_not_have(tmp_path: Path) -> None:
    import subprocess
    import sys

    target = tmp_path / "out" / "big.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "examples/make_reviews.py"), "--lines", "3", "--out", str(target)],
        check=True,
        capture_output=True,
    )
    assert len(target.read_text().splitlines()) == 3
