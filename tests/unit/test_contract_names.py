"""Every layout, key and status word is written once, in the contract (`sluice.contract`) or the
table's keys (`sluice.store.keys`): elsewhere in functions/, infra/ and sluice_local/ a string literal that is a
piece of one fails here, named by file and line.

A literal is a piece of a layout when it has no whitespace (prose in a help text or a message may
mention `.summary.json`; a key never has a space) and holds one of the layout's markers, or when it
is exactly a status word or one of the table's key attribute names. A JSONPath into the workflow's
state (`$.shard.mode`) is one too: the state's keys and fields are named through the contract
(`SHARD_KEY`, `ShardSpec.path`, `StepResult.path`). The workflow's definition, which the contract
was made for, also spells no mode.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sluice.contract import MODES

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("functions", "infra", "sluice_local")
# where the names are written, once
HOMES = {
    *(path.relative_to(ROOT).as_posix() for path in (ROOT / "functions" / "sluice" / "contract").glob("*.py")),
    "functions/sluice/store/keys.py",
}
# files that still spell a name the contract holds, each with what (none now: keep it that way)
NOT_YET: dict[str, str] = {}
# a piece of a key or an S3 layout: never written outside its home
LAYOUT_MARKERS = (
    "inbox/",
    "outbox/",
    "jobs/",
    "shards/",
    ".summary.json",
    ".results.jsonl",
    ".errors.jsonl",
    "JOB#",
    "ITEM#",
    "RESP#",
    "EARLY#",
    "WEBHOOK#",
)
# a path into an execution's state that names a key (`$$.` is the context object, AWS's own names)
STATE_PATH = re.compile(r"\$\.[A-Za-z_]")
# a job's, a shard's or an execution's status, and the table's key attributes: a constant, not a literal
WORDS = {
    "PLANNING",
    "RUNNING",
    "SUCCEEDED",
    "COMPLETED_WITH_ERRORS",
    "FAILED",
    "CANCELLED",
    "BUDGET_EXCEEDED",
    "PENDING",
    "DONE",
    "ABORTED",
    "TIMED_OUT",
    "pk",
    "sk",
}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def stray_literals(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    # docstrings, and a table's column headings (`f"{'DONE':>8}"`), are text for people
    skipped = _docstrings(tree) | {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.FormattedValue)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skipped:
            continue
        text = node.value
        if text in WORDS or (
            not any(c.isspace() for c in text) and (any(m in text for m in LAYOUT_MARKERS) or STATE_PATH.match(text))
        ):
            yield node.lineno, text


def strays() -> list[str]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name in HOMES or name in NOT_YET:
                continue
            found += [f"{name}:{line}: {text!r}" for line, text in stray_literals(path)]
    return found


@pytest.mark.slow
def test_no_layout_key_or_status_is_spelled_outside_the_contract() -> None:
    assert strays() == [], "read these from sluice.contract or sluice.store.keys:\n" + "\n".join(strays())


def test_the_scan_finds_a_stray_literal(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        '"""Writes <name>.summary.json."""\n'
        'KEY = prefix + ".summary.json"\n'
        'S = "RUNNING"\n'
        'HELP = "writes <name>.summary.json"\n'
        "HEADING = f\"{'DONE':>8}\"\n"
        'P = f"jobs/{job}/shards/{n:05d}/"\n'
        'MODE = {"Variable": "$.shard.mode", "Payload.$": "$", "Token.$": "$$.Task.Token", "Path": f"$.{KEY}"}\n'
    )
    assert sorted(stray_literals(module)) == [
        (2, ".summary.json"),
        (3, "RUNNING"),
        (6, "/shards/"),
        (6, "jobs/"),
        (7, "$.shard.mode"),
    ]


def test_the_definition_spells_no_mode() -> None:
    path = ROOT / "functions" / "sluice" / "contract" / "definition.py"
    spelled = [
        f"{node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in MODES
    ]
    assert spelled == [], "read the modes from sluice.contract.Mode:\n" + "\n".join(spelled)


def test_every_file_not_yet_reading_the_contract_still_exists() -> None:
    assert [name for name in NOT_YET if not (ROOT / name).exists()] == []
