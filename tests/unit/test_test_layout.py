"""No test module imports another: what tests share lives in a conftest or a fixture module
(a `helpers` package, `cache_fakes.py` and the like), so each test module runs, and fails, alone."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _test_modules_imported(path: Path) -> list[str]:
    """The test modules (`test_*`) that the file at `path` imports, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            # `from tests.e2e import test_cli` imports a module by name, as `from . import test_cli` does
            modules = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        ours = [m for m in modules if m.startswith(("tests.", "."))]
        found += [m for m in ours if any(part.startswith("test_") for part in m.split("."))]
    return found


def test_no_test_module_imports_another() -> None:
    offenders = {
        str(path.relative_to(TESTS)): imported
        for path in sorted(TESTS.rglob("*.py"))
        if (imported := _test_modules_imported(path))
    }
    assert offenders == {}


def test_the_check_sees_each_way_of_importing_a_test_module(tmp_path: Path) -> None:
    written = {
        "from tests.unit.test_engine import Scripted": ["tests.unit.test_engine", "tests.unit.test_engine.Scripted"],
        "from tests.e2e import test_cli": ["tests.e2e.test_cli"],
        "import tests.unit.test_batch": ["tests.unit.test_batch"],
        "from .test_batch import env": [".test_batch", ".test_batch.env"],
        "def f():\n    from tests.unit.test_cancel import Aws": [
            "tests.unit.test_cancel",
            "tests.unit.test_cancel.Aws",
        ],
        "from tests.unit.helpers.engine import Scripted": [],
        "from tests.conftest import request_line": [],
        "from moto.stepfunctions.parser.backend.test_state import execution_worker": [],
    }
    for source, modules in written.items():
        path = tmp_path / "test_example.py"
        path.write_text(source + "\n")
        assert _test_modules_imported(path) == modules, source
