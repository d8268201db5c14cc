"""The project's modules and what each imports, read from the source with `ast`, for the tests of
its import rules (`test_architecture`, `test_module_sizes`).

Every `import` and `from ... import` counts, at module level or inside a function (the CLI
imports a command's dependencies late, and a late import breaks a layer just as well).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Where each importable top-level package lives (pyproject.toml's package-dir).
PACKAGES = {
    "sluice": ROOT / "functions" / "sluice",
    "sluice_handlers": ROOT / "functions" / "sluice_handlers",
    "infra": ROOT / "infra",
    "sluice_local": ROOT / "sluice_local",
    "bench": ROOT / "bench",
}


def module_name(path: Path) -> str:
    for package, folder in PACKAGES.items():
        if path.is_relative_to(folder):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(f"{path} is in no known package")


def imports(source: str, module: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) of everything `module` imports; `from a import b` is `a.b`."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target == "__future__":
                continue
            for alias in node.names:
                yield node.lineno, target if alias.name == "*" else f"{target}.{alias.name}"


def files(package: str) -> list[Path]:
    found = sorted(p for p in PACKAGES[package].rglob("*.py") if ".venv" not in p.parts)
    assert found, f"no Python files under {PACKAGES[package]}: the layer moved and these rules check nothing"
    return found


def imports_of(package: str) -> Iterator[tuple[str, str, str]]:
    """(file:line, importing module, imported name) for every import in the package."""
    for path in files(package):
        name = module_name(path)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        for line, imported in imports(path.read_text(), name, is_package=path.name == "__init__.py"):
            yield f"{shown}:{line}", name, imported


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def top(name: str) -> str:
    return name.split(".", 1)[0]


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
    found: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def module_imports(packages: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    """(importing module, imported module) -> where, among the modules of `packages`.

    An import names the longest module that exists (`from a.b import name` of a name defined in
    `a.b` is `a.b`), and runs each package above it first: `import a.b.c` is an import of `a.b`
    too, unless the importer is inside `a.b` (then `a.b` is running already).
    """
    known = {module_name(path) for package in packages for path in files(package)}
    found: dict[tuple[str, str], list[str]] = {}
    for package in packages:
        for where, module, imported in imports_of(package):
            target = imported
            while target and target not in known:
                target = target.rpartition(".")[0]
            if not target or target == module:
                continue
            parts = target.split(".")
            above = [".".join(parts[:end]) for end in range(1, len(parts))]
            for name in [*(a for a in above if a in known and not within(module, a)), target]:
                found.setdefault((module, name), []).append(where)
    return found
