"""Two rules of the house style, read from the source: no Python module over `MAX_LINES` lines, and
no import circle among the modules of the product (one module importing, through others, itself).

A circle is found by `ast` over every import, late ones in functions and the `TYPE_CHECKING` ones
included: a circle Python tolerates today (a late import, an annotation only) still ties two
modules that should be one above the other, and breaks as soon as an import moves up.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.import_graph import PACKAGES, ROOT, cycles, module_imports

MAX_LINES = 500
# every folder of Python the project keeps
SIZED = ("functions", "sluice_local", "infra", "bench", "tests", "examples")
# the product's packages; bench's scripts import the product, never the other way round
CIRCLE_FREE = ("sluice", "sluice_handlers", "sluice_local", "infra")


def line_counts(root: Path, folders: tuple[str, ...]) -> dict[str, int]:
    """Lines of each .py under `folders` of `root` (as `wc -l` counts them), by path from `root`."""
    counts: dict[str, int] = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            if {".venv", "node_modules", "cdk.out"} & set(path.parts):
                continue
            counts[path.relative_to(root).as_posix()] = path.read_bytes().count(b"\n")
    return counts


def too_long(counts: dict[str, int]) -> dict[str, int]:
    return {path: lines for path, lines in counts.items() if lines > MAX_LINES}


def circles() -> list[list[str]]:
    return cycles(set(module_imports(CIRCLE_FREE)))


def test_no_module_is_over_500_lines() -> None:
    long = too_long(line_counts(ROOT, SIZED))
    assert not long, f"split these along a seam (at most {MAX_LINES} lines a module): {long}"


def test_no_module_of_the_product_imports_itself_back() -> None:
    found = circles()
    where = module_imports(CIRCLE_FREE)
    shown = [" -> ".join(c) + f" ({where[(c[-2], c[-1])][0]})" for c in found]
    assert not found, "import circles: move what both need to a module below both:\n" + "\n".join(shown)


def test_the_size_rule_catches_a_long_module(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "tests" / "test_short.py").write_text("x = 1\n" * MAX_LINES)
    assert too_long(line_counts(tmp_path, ("tests",))) == {"tests/test_long.py": MAX_LINES + 1}


@pytest.mark.parametrize(
    ("files", "circle"),
    [
        # a late import in a function closes the circle as well as one at the top
        (
            {"a.py": "from sluice_local.b import B\n", "b.py": "def f():\n    from sluice_local.a import A\n"},
            ["sluice_local.a", "sluice_local.b", "sluice_local.a"],
        ),
        # so does one for annotations only
        (
            {
                "a.py": "from sluice_local.b import B\n",
                "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sluice_local.a import A\n",
            },
            ["sluice_local.a", "sluice_local.b", "sluice_local.a"],
        ),
        # importing a module of a package runs the package, which imports back
        (
            {
                "pkg/__init__.py": "from sluice_local.pkg.inner import run\n",
                "pkg/inner.py": "from sluice_local.names import NAME\nfrom sluice_local.rules import RULES\n",
                "pkg/names.py": "",
                "names.py": "",
                "rules.py": "from sluice_local.pkg.names import NAME\n",
            },
            ["sluice_local.pkg", "sluice_local.pkg.inner", "sluice_local.rules", "sluice_local.pkg"],
        ),
    ],
)
def test_the_circle_rule_catches_an_import_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str], circle: list[str]
) -> None:
    fake = tmp_path / "sluice_local"
    for name, source in {"__init__.py": "", **files}.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(source)
    for package in CIRCLE_FREE:
        empty = tmp_path / "empty" / package
        empty.mkdir(parents=True)
        (empty / "__init__.py").write_text("")
        monkeypatch.setitem(PACKAGES, package, empty)
    monkeypatch.setitem(PACKAGES, "sluice_local", fake)
    assert circles() == [circle]
